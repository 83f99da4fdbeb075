// The live socket and the buffering of what it sends while a page (or a part of it) loads.

// A websocket that reconnects; onOpen fires after every (re)connect so pages can resync.
export function live(path, onMessage, onOpen) {
  let ws,
    closed = false,
    delay = 500;
  const connect = () => {
    ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + path);
    ws.onmessage = (ev) => onMessage(JSON.parse(ev.data));
    ws.onopen = () => {
      delay = 500;
      if (onOpen) onOpen();
    };
    ws.onclose = () => {
      if (closed) return;
      delay = Math.min(delay * 2, 8000);
      setTimeout(connect, delay);
    };
  };
  connect();
  return {
    close: () => {
      closed = true;
      ws.close();
    },
  };
}

// One live-switch for every page: a message goes to handlers[msg.type] (types a page does not
// handle are ignored); with a LoadBuffer, messages that arrive while the page loads wait for it.
export function byType(handlers, buffer = null) {
  const handle = (msg) => handlers[msg.type]?.(msg);
  return (msg) => {
    if (!buffer?.hold(msg)) handle(msg);
  };
}

// What a live socket sends while a page (or one chart) fetches its data is held, then replayed in
// order once the fetch is done: nothing sent during a load is lost or applied to stale data.
export class LoadBuffer {
  constructor() {
    this.loading = false;
    this.held = [];
  }

  // A load begins: anything held from an earlier one is dropped (the new fetch covers it).
  start() {
    this.loading = true;
    this.held = [];
  }

  // True when the message was held (a load is under way); the caller handles it otherwise.
  hold(...msg) {
    if (this.loading) this.held.push(msg);
    return this.loading;
  }

  // The load is done: replay what was held, in arrival order, through handle(...msg).
  end(handle) {
    this.loading = false;
    const held = this.held;
    this.held = [];
    for (const msg of held) handle(...msg);
  }
}
