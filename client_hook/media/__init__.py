"""Values beyond numbers: ``Histogram``, ``Image``, ``Table`` (and text), captured on the training thread, encoded on the sender's."""

from gradwatch.media.base import MediaValue
from gradwatch.media.histogram import Histogram
from gradwatch.media.image import Image
from gradwatch.media.table import Table, Text

__all__ = ["MediaValue", "Histogram", "Image", "Table", "Text"]
