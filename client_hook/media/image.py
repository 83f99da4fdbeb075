"""``gradwatch.Image``: a picture to log, copied on the training thread, encoded to PNG on the sender thread.

Accepted: a tensor (HW, CHW with 1/3/4 channels; any device), a numpy array (HW, HWC), a PIL image,
a path to an image file or an image file's bytes. Floats are taken as 0-1 (W&B's convention) unless their values reach
past 1, then as 0-255. Pillow encodes when installed; otherwise ``gradwatch.media.png`` does.
"""

from __future__ import annotations

import base64
import io
import os
import sys

from gradwatch import values
from gradwatch.media import limits, png
from gradwatch.media.base import MediaValue
from gradwatch.media.limits import MediaRefused


class Image(MediaValue):
    """An image to log: ``run.log({"samples": gradwatch.Image(grid, caption="epoch 3")})`` (or a list of them).

    Args:
        data_or_path: tensor, numpy array, PIL image or file path.
        caption: shown under the image.
        mode: accepted for W&B compatibility; the channels decide the PNG's mode.
    """

    kind = "image"

    def __init__(self, data_or_path=None, mode=None, caption: str | None = None, **_ignored):
        self.caption = None if caption is None else str(caption)[:1000]
        self._tensor = None  # detached copy, with the event that marks when it is ready (device tensors)
        self._event = None
        self._array = None
        self._pil = None
        self._path = None
        self._encoded = None
        self.raw_bytes = 0
        self.guarded_init(self._capture, data_or_path)

    def _capture(self, data) -> None:
        torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
        if torch is not None and isinstance(data, torch.Tensor):
            _check_raw(data.numel() * data.element_size(), tuple(data.shape))
            if data.is_complex() or data.dim() not in (2, 3):
                raise MediaRefused(
                    f"an image tensor must be HW or CHW of real numbers, got {data.dtype} {tuple(data.shape)}"
                )
            self._tensor = data.detach().clone()  # on the device: asynchronous, and safe from in-place updates
            self._event = values.defer_vector(self._tensor.reshape(-1)[:1]).event
            self.raw_bytes = data.numel() * data.element_size()
        elif np is not None and isinstance(data, np.ndarray):
            _check_raw(data.nbytes, data.shape)
            if data.dtype.kind not in "buif" or data.ndim not in (2, 3):
                raise MediaRefused(f"an image array must be HW or HWC of real numbers, got {data.dtype} {data.shape}")
            self._array, self.raw_bytes = np.array(data), data.nbytes
        elif isinstance(data, (bytes, bytearray)):  # an encoded image (PNG as is; other formats through Pillow)
            _check_raw(len(data), None)
            self._encoded, self.raw_bytes = bytes(data), len(data)
        elif isinstance(data, (str, os.PathLike)):
            size = os.stat(data).st_size
            _check_raw(size, None)
            self._path, self.raw_bytes = os.fspath(data), size
        elif hasattr(data, "save") and hasattr(data, "size") and hasattr(data, "mode"):  # a PIL image
            width, height = data.size
            _check_raw(width * height * 4, (height, width))
            self._pil, self.raw_bytes = data, width * height * 4
        else:
            raise MediaRefused(f"cannot make an image of a {type(data).__name__}")

    def estimated_bytes(self) -> int:
        return min(self.raw_bytes, limits.MAX_IMAGE_BYTES)

    def to_wire(self, resolved: dict | None = None) -> dict:
        """{"png": base64, "width", "height", "caption"} (sender thread)."""
        if self.refused:
            raise MediaRefused(self.refused)
        data = self._encode()
        if len(data) > limits.MAX_IMAGE_BYTES:
            raise MediaRefused(f"image of {len(data):,} bytes as PNG is over the limit of {limits.MAX_IMAGE_BYTES:,}")
        size = png.size_of(data)
        if size is None:
            raise MediaRefused("image file is not a PNG and Pillow is not installed to convert it")
        out = {"png": base64.b64encode(data).decode("ascii"), "width": size[0], "height": size[1]}
        if self.caption:
            out["caption"] = self.caption
        return out

    def _encode(self) -> bytes:
        pil = _pil()
        if self._path is not None or self._encoded is not None:
            data = self._encoded
            if data is None:
                with open(self._path, "rb") as f:
                    data = f.read(limits.MAX_IMAGE_RAW_BYTES + 1)
            if png.size_of(data) is not None or pil is None:
                return data
            image = pil.open(io.BytesIO(data))
            image.load()
            return _pil_png(image)
        if self._pil is not None:
            return _pil_png(self._pil)
        pixels, height, width, channels = self._pixels()
        if pil is not None:
            mode = {1: "L", 3: "RGB", 4: "RGBA"}[channels]
            return _pil_png(pil.frombytes(mode, (width, height), pixels))
        return png.encode(pixels, width, height, channels)

    def _pixels(self) -> tuple[bytes, int, int, int]:
        """uint8 HWC bytes of a tensor or array, with its height, width and channels."""
        if self._tensor is not None:
            if self._event is not None:
                self._event.synchronize()
            t = self._tensor.cpu()
            t = t.permute(1, 2, 0) if t.dim() == 3 and t.shape[0] in (1, 3, 4) and t.shape[-1] not in (1, 3, 4) else t
            array = t.float().numpy() if sys.modules.get("numpy") is not None else None
            if array is None:
                return _tensor_bytes(t)
        else:
            array = self._array
        return _array_bytes(sys.modules["numpy"], array)


def _check_raw(nbytes: int, shape) -> None:
    if nbytes > limits.MAX_IMAGE_RAW_BYTES:
        shown = f" {tuple(shape)}" if shape is not None else ""
        raise MediaRefused(f"image{shown} of {nbytes:,} bytes is over the limit of {limits.MAX_IMAGE_RAW_BYTES:,}")


def _array_bytes(np, array) -> tuple[bytes, int, int, int]:
    if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
        array = array.transpose(1, 2, 0)  # CHW -> HWC
    if array.ndim == 2:
        array = array[:, :, None]
    if array.shape[-1] not in (1, 3, 4):
        raise MediaRefused(f"an image needs 1, 3 or 4 channels, got shape {array.shape}")
    if array.dtype != np.uint8:
        array = np.nan_to_num(array.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
        if array.size and array.max() <= 1.0:
            array = array * 255.0
        array = np.clip(array, 0, 255).astype(np.uint8)
    height, width, channels = array.shape
    return np.ascontiguousarray(array).tobytes(), height, width, channels


def _tensor_bytes(t) -> tuple[bytes, int, int, int]:
    """Without numpy: the same conversion with torch alone."""
    t = t.unsqueeze(-1) if t.dim() == 2 else t
    t = t.float().nan_to_num(0.0, 255.0, 0.0)
    if t.numel() and float(t.max()) <= 1.0:
        t = t * 255.0
    t = t.clamp(0, 255).to(dtype=sys.modules["torch"].uint8).contiguous()
    height, width, channels = t.shape
    return bytes(t.reshape(-1).tolist()), height, width, channels


def _pil():
    try:
        from PIL import Image as PILImage
    except ImportError:
        return None
    return PILImage


def _pil_png(image) -> bytes:
    buf = io.BytesIO()
    if image.mode not in ("L", "RGB", "RGBA"):
        image = image.convert("RGBA" if "A" in image.mode else "RGB")
    image.save(buf, format="PNG")
    return buf.getvalue()
