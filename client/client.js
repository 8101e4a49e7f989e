/* pubsub browser client: the Faye.Client API over WebSocket, CORS long-polling and JSON-P. MIT licence. */
(function (global) {
'use strict';

// ---- constants and small helpers

var HANDSHAKE = '/meta/handshake', CONNECT = '/meta/connect', SUBSCRIBE = '/meta/subscribe',
    UNSUBSCRIBE = '/meta/unsubscribe', DISCONNECT = '/meta/disconnect';
var WS = 'websocket', LP = 'long-polling', CORS = 'cross-origin-long-polling', JSONP = 'callback-polling';
var UNCONNECTED = 1, CONNECTING = 2, CONNECTED = 3, DISCONNECTED = 4;
// A JSON-P request URL is kept under this length when it holds more than one message.
var MAX_URL = 2000;
var jsonpCount = 0;

function later(fn, ms) { return setTimeout(fn, ms); }

// An exception from user code (a callback, an extension) is reported without breaking the client.
function report(e) { later(function () { throw e; }, 0); }

function each(list, fn, ctx) { for (var i = 0; i < list.length; i++) fn.call(ctx, list[i], i); }

function bySeq(a, b) { return a.seq - b.seq; }

// The envelopes a transport sends: one, or a group that goes out together (one frame, one request).
function members(env) { return env.group || [env]; }

function jsonOf(env) { return env.json; }

// The positions of the last `capacity` messages delivered, to deliver each once: after a WebSocket dies while its
// session lives, the broker sends again, on the next connection, what the client had not confirmed, and a resume may
// cover messages that arrived already. A message carries the same `ext.position` on every delivery.
function RecentPositions(capacity) {
  this._capacity = capacity;
  this._held = Object.create(null);
  this._order = [];
  this._next = 0;
}

// Adds `position`; false when it was there already (a message delivered before).
RecentPositions.prototype.add = function (position) {
  if (this._held[position]) return false;
  this._held[position] = true;
  if (this._order.length < this._capacity) {
    this._order.push(position);
  } else {
    delete this._held[this._order[this._next]];
    this._order[this._next] = position;
    this._next = (this._next + 1) % this._capacity;
  }
  return true;
};

function isMeta(channel) { return channel.indexOf('/meta/') === 0; }

// The position of a subscription after a message at `position` (docs/PROTOCOL.md, "Brokers spread over shards").
// A broker spread over shards (`--redis-shards`) gives at the handshake a position with one part per shard
// (`2.<epoch>.<p>~2.<epoch>.<p>…`), and each message the position of its own shard, which that shard's epoch (the
// second field) names: the part with the message's epoch is replaced, so a subscription over several shards
// (`/**`) keeps a part for each and resumes exactly. Anything else (one broker's positions, a message of an epoch
// the stored position has no part for) is replaced whole. The same rule as `pubsub subscribe`
// (Sources/PubSubClient/SubscriptionPositions.swift).
function advance(stored, position) {
  if (!stored || stored.indexOf('~') < 0 || position.indexOf('~') >= 0) return position;
  var shard = epochOf(position), parts = stored.split('~');
  if (shard === null) return position;
  for (var i = 0; i < parts.length; i++) {
    if (epochOf(parts[i]) === shard) {
      parts[i] = position;
      return parts.join('~');
    }
  }
  return position;
}

function epochOf(token) {
  var fields = token.split('.');
  return fields.length === 3 ? fields[1] : null;
}

// The names a message on `channel` is routed to: /a/b/c -> /**, /a/b/c, /a/b/*, /a/**, /a/b/**
function expand(channel) {
  var segs = channel.split('/').slice(1), out = ['/**', channel], last = segs.slice();
  last[last.length - 1] = '*';
  out.push('/' + last.join('/'));
  for (var i = 1; i < segs.length; i++) out.push('/' + segs.slice(0, i).join('/') + '/**');
  return out;
}

// A Bayeux error string such as "401:abc:Unknown client"; other strings keep their text as the message.
function BayeuxError(text) {
  var m = /^(\d{3}):([^:]*):([\s\S]*)$/.exec(text || '');
  this.code = m ? +m[1] : null;
  this.params = m && m[2] ? m[2].split(',') : [];
  this.message = m ? m[3] : (text || 'Unknown error');
  this.error = text;
}
BayeuxError.prototype.toString = function () { return this.error || this.message; };

// Makes `obj` a thenable settled once: then/catch, and Faye's callback/errback.
function deferred(obj) {
  var settle, promise = new Promise(function (resolve, reject) { settle = [resolve, reject]; });
  promise['catch'](function () {});
  obj.then = function (ok, fail) { return promise.then(ok, fail); };
  obj['catch'] = function (fail) { return promise.then(null, fail); };
  obj.callback = function (fn, ctx) { promise.then(function (v) { fn.call(ctx, v); }); return obj; };
  obj.errback = function (fn, ctx) { promise.then(null, function (e) { fn.call(ctx, e); }); return obj; };
  obj._resolve = settle[0];
  obj._reject = settle[1];
  return obj;
}

function resolveURL(url) {
  try { return new URL(url, global.location && global.location.href).href; } catch (e) { return url; }
}

function originOf(url) {
  try { return new URL(url).origin; } catch (e) { return null; }
}

// ---- Subscription: returned by subscribe(); thenable, cancel() ends it

function Subscription(client, channel, fn, ctx) {
  this._client = client;
  this._channel = channel;
  this._fn = fn;
  this._ctx = ctx;
  this._withChannel = null;
  deferred(this);
}

Subscription.prototype.cancel = Subscription.prototype.unsubscribe = function () {
  this._client._cancel(this);
};

Subscription.prototype.withChannel = function (fn, ctx) {
  this._withChannel = [fn, ctx];
  return this;
};

Subscription.prototype._call = function (message) {
  try {
    if (this._fn) this._fn.call(this._ctx, message.data);
    if (this._withChannel) this._withChannel[0].call(this._withChannel[1], message.channel, message.data);
  } catch (e) {
    report(e);
  }
};

// ---- Polling transports: XMLHttpRequest (same origin or CORS) and JSON-P
// Connects travel alone; other messages are batched, one request at a time, so they reach the server in order.

function Polling(client, type) {
  this.type = type;
  this._client = client;
  this._url = client._url;
  this._batch = [];
  this._busy = false;
  this._timer = null;
}

Polling.prototype.send = function (env) {
  if (env.group) return this._request(env.group);
  if (env.msg.channel === CONNECT) return this._request([env]);
  this._batch.push(env);
  if (!this._busy && !this._timer) {
    var self = this;
    this._timer = later(function () { self._timer = null; self._next(); }, 0);
  }
};

Polling.prototype._next = function () {
  if (this._busy || !this._batch.length) return;
  var batch = this._batch, size = 0, n = 0;
  if (this.type === JSONP) {
    while (n < batch.length && (n === 0 || size + batch[n].json.length * 3 < MAX_URL)) size += batch[n++].json.length * 3;
  } else {
    n = batch.length;
  }
  this._busy = true;
  this._request(batch.splice(0, n), true);
};

Polling.prototype._done = function (lane) {
  if (!lane) return;
  this._busy = false;
  this._next();
};

Polling.prototype._request = function (envs, lane) {
  var self = this, client = this._client, done = false, body = '[' + envs.map(function (e) { return e.json; }).join(',') + ']';
  function finish(replies, status) {
    if (done) return;
    done = true;
    if (replies) client._receive(replies);
    else if (status >= 400 && status < 500) client._rejectAll(envs, status);
    else client._failed(self, envs);
    self._done(lane);
  }
  if (this.type === JSONP) return this._jsonp(body, finish);
  var xhr = new XMLHttpRequest();
  xhr.open('POST', this._url, true);
  if (this.type === CORS) {
    xhr.withCredentials = true;
    xhr.setRequestHeader('Content-Type', 'application/x-www-form-urlencoded');
    body = 'message=' + encodeURIComponent(body);
  } else {
    xhr.setRequestHeader('Content-Type', 'application/json');
    xhr.setRequestHeader('X-Requested-With', 'XMLHttpRequest');
  }
  for (var name in client._headers) xhr.setRequestHeader(name, client._headers[name]);
  xhr.timeout = client._requestTimeout();
  xhr.onload = function () {
    var replies = null;
    if (xhr.status === 200) try { replies = JSON.parse(xhr.responseText); } catch (e) {}
    finish(replies, xhr.status);
  };
  xhr.onerror = xhr.ontimeout = xhr.onabort = function () { finish(null, 0); };
  xhr.send(body);
};

Polling.prototype._jsonp = function (body, finish) {
  var self = this, doc = global.document;
  // A script added before the page has loaded holds back its load event: a held connect would for its whole hold.
  if (doc.readyState !== 'complete') {
    return global.addEventListener('load', function () { later(function () { self._jsonp(body, finish); }, 0); });
  }
  var name = '__jsonp' + (++jsonpCount) + '__', script = doc.createElement('script'), timer;
  function cleanup(ok) {
    clearTimeout(timer);
    if (script.parentNode) script.parentNode.removeChild(script);
    if (ok) delete global[name];
    else global[name] = function () {};
  }
  global[name] = function (replies) { cleanup(true); finish(replies, 200); };
  script.onerror = function () { cleanup(false); finish(null, 0); };
  timer = later(function () { cleanup(false); finish(null, 0); }, this._client._requestTimeout());
  script.src = this._url + (this._url.indexOf('?') < 0 ? '?' : '&') + 'message=' + encodeURIComponent(body) +
    '&jsonp=' + name;
  (doc.head || doc.documentElement).appendChild(script);
};

Polling.prototype.close = function () {};

// ---- WebSocket transport: one message per frame; replies and events arrive as arrays

function Socket(client, url) {
  this.type = WS;
  this._client = client;
  this._url = url;
  this._ws = null;
  this._open = false;
  this._queue = [];
  this._sent = [];
}

Socket.prototype.send = function (env) {
  if (this._open) return this._write(env);
  this._queue.push(env);
  if (this._ws) return;
  var self = this, ws;
  try {
    ws = this._ws = new global.WebSocket(this._url);
  } catch (e) {
    this._ws = null;
    return this._closed(null);
  }
  // A proxy may neither pass nor refuse the upgrade: a socket not open in time counts as blocked.
  var opening = later(function () { self._closed(ws); }, Math.min(10000, this._client._requestTimeout()));
  ws.onopen = function () {
    clearTimeout(opening);
    if (self._ws !== ws) return;
    self._open = true;
    var queue = self._queue;
    self._queue = [];
    each(queue, self._write, self);
  };
  ws.onmessage = function (event) {
    if (self._ws !== ws) return;
    var list;
    try { list = JSON.parse(event.data); } catch (e) { return; }
    if (!(list instanceof Array)) list = [list];
    each(list, function (reply) {
      if (!('successful' in reply)) return;
      for (var i = 0; i < self._sent.length; i++) {
        if (self._sent[i].msg.id === reply.id) { clearTimeout(self._sent[i].timer); self._sent.splice(i, 1); break; }
      }
    });
    self._client._receive(list);
  };
  ws.onclose = ws.onerror = function () { clearTimeout(opening); self._closed(ws); };
};

Socket.prototype._write = function (env) {
  var self = this, ws = this._ws, envs = members(env), timeout = this._client._requestTimeout();
  each(envs, function (e) {
    self._sent.push(e);
    e.timer = later(function () { self._closed(ws); }, timeout);
  });
  try { ws.send('[' + envs.map(jsonOf).join(',') + ']'); } catch (e) { this._closed(ws); }
};

Socket.prototype._closed = function (ws) {
  if (ws !== this._ws) return;
  var opened = this._open, envs = this._sent;
  each(this._queue, function (env) { envs = envs.concat(members(env)); });
  this._ws = null;
  this._open = false;
  this._sent = [];
  this._queue = [];
  each(envs, function (env) { clearTimeout(env.timer); });
  if (ws) try { ws.onclose = ws.onerror = ws.onmessage = null; ws.close(); } catch (e) {}
  if (envs.length || opened) this._client._failed(this, envs, !opened);
};

Socket.prototype.close = function () {
  var ws = this._ws;
  this._ws = null;
  this._open = false;
  if (ws) try { ws.close(); } catch (e) {}
};

// ---- Client

function Client(endpoint, options) {
  var self = this;
  options = options || {};
  this._url = resolveURL(endpoint || '/faye');
  this._options = options;
  this._retry = 1000 * (options.retry || 5);
  this._advice = { reconnect: 'retry', interval: 1000 * (options.interval || 0), timeout: 1000 * (options.timeout || 60) };
  this._headers = {};
  this._disabled = {};
  this._extensions = [];
  this._events = {};
  this._channels = {};
  this._pending = {};
  this._outbox = [];
  this._pipes = { incoming: [], outgoing: [] };
  this._state = UNCONNECTED;
  this._clientId = null;
  this._ids = 0;
  this._seq = 0;
  this._up = undefined;
  this._connecting = false;
  // A transport failed while the session lives: the next connect resumes every subscription first.
  this._resuming = false;
  this._recent = new RecentPositions(1000);
  this._retryTimer = null;
  this._serverTypes = [];
  this._transport = null;
  this._poll = null;
  this._socket = null;
  if (global.addEventListener) global.addEventListener('pagehide', function () {
    if (!self._disabled.autodisconnect) self.disconnect();
  });
}

var api = Client.prototype;

// -- events: transport:up, transport:down

api.bind = api.on = function (name, fn, ctx) {
  (this._events[name] = this._events[name] || []).push([fn, ctx]);
  return this;
};

api.unbind = api.off = function (name, fn) {
  var list = this._events[name] || [];
  for (var i = list.length - 1; i >= 0; i--) if (!fn || list[i][0] === fn) list.splice(i, 1);
  return this;
};

api.trigger = function (name) {
  var args = Array.prototype.slice.call(arguments, 1);
  each((this._events[name] || []).slice(), function (h) {
    try { h[0].apply(h[1], args); } catch (e) { report(e); }
  });
};

// -- configuration

api.addExtension = function (extension) {
  this._extensions.push(extension);
  if (extension.added) extension.added(this);
};

api.removeExtension = function (extension) {
  var i = this._extensions.indexOf(extension);
  if (i < 0) return;
  this._extensions.splice(i, 1);
  if (extension.removed) extension.removed(this);
};

api.disable = function (feature) { this._disabled[feature] = true; };

api.setHeader = function (name, value) { this._headers[name] = value; };

api.getClientId = function () { return this._clientId; };

api.getState = function () {
  return ['', 'UNCONNECTED', 'CONNECTING', 'CONNECTED', 'DISCONNECTED'][this._state];
};

api.getTransport = function () { return this._transport && this._transport.type; };

// -- public operations

api.connect = function (fn, ctx) {
  if (this._state === CONNECTED) { if (fn) fn.call(ctx); return; }
  if (fn) this.bind('connected', function once() { this.unbind('connected', once); fn.call(ctx); }, this);
  this._handshake();
};

api.subscribe = function (channel, fn, ctx) {
  var sub = new Subscription(this, channel, fn, ctx), ch = this._channels[channel];
  if (ch) {
    ch.subs.push(sub);
    if (ch.active) sub._resolve();
    return sub;
  }
  this._channels[channel] = { subs: [sub], active: false };
  if (this._state === CONNECTED) this._subscribe(channel);
  else this._handshake();
  return sub;
};

api.unsubscribe = function (channel, fn) {
  var ch = this._channels[channel];
  if (!ch) return;
  each(ch.subs.slice(), function (sub) {
    if (!fn || sub === fn || sub._fn === fn) this._cancel(sub);
  }, this);
};

api.publish = function (channel, data) {
  var publication = deferred({});
  this._send({ channel: channel, data: data, clientId: this._clientId }, function (reply) {
    if (reply.successful) publication._resolve();
    else publication._reject(new BayeuxError(reply.error));
  });
  if (this._state !== CONNECTED) this._handshake();
  return publication;
};

api.disconnect = function () {
  var done = deferred({}), self = this, was = this._state;
  this._state = DISCONNECTED;
  this._outbox = [];
  this._connecting = false;
  clearTimeout(this._retryTimer);
  this._retryTimer = null;
  if (was !== CONNECTED) {
    this._closeTransports();
    done._resolve();
    return done;
  }
  this._send({ channel: DISCONNECT, clientId: this._clientId }, function (reply) {
    self._closeTransports();
    if (reply.successful) done._resolve();
    else done._reject(new BayeuxError(reply.error));
  });
  return done;
};

// -- session

api._requestTimeout = function () {
  return Math.max(1.2 * this._advice.timeout, this._retry) + 1000;
};

api._types = function () {
  var types = [], disabled = this._disabled;
  if (global.WebSocket && !disabled[WS]) types.push(WS);
  if (global.XMLHttpRequest) {
    if (!disabled[LP] && originOf(this._url) === (global.location && global.location.origin)) types.push(LP);
    if (!disabled[CORS]) types.push(CORS);
  }
  types.push(JSONP);
  return types;
};

// The transport for the handshake (and after a WebSocket failure): XHR when usable, else JSON-P.
api._polling = function () {
  var types = this._types(), servers = this._serverTypes, type = JSONP;
  each([LP, CORS], function (t) {
    if (type === JSONP && types.indexOf(t) >= 0 && (!servers.length || servers.indexOf(t) >= 0)) type = t;
  });
  if (!this._poll || this._poll.type !== type) this._poll = new Polling(this, type);
  return this._poll;
};

api._select = function () {
  if (!this._wsBroken && this._types().indexOf(WS) >= 0 && this._serverTypes.indexOf(WS) >= 0) {
    var wsURL = (this._options.endpoints && this._options.endpoints.websocket) || this._url.replace(/^http/, 'ws');
    if (!this._socket) this._socket = new Socket(this, wsURL);
    return this._socket;
  }
  return this._polling();
};

api._handshake = function () {
  if (this._state !== UNCONNECTED && this._state !== DISCONNECTED) return;
  var self = this;
  this._state = CONNECTING;
  this._clientId = null;
  this._wsBroken = false;
  var message = { channel: HANDSHAKE, version: '1.0', supportedConnectionTypes: this._types() };
  this._withToken(function (token) {
    if (self._state !== CONNECTING) return;
    if (token) message.ext = { token: token };
    self._sendHandshake(message);
  });
};

// pubsub's `token` option (docs/AUTH.md): a JWT sent as the handshake's `ext.token`, or a function called before
// every handshake that returns one or a promise of one. A session whose token expired is told to handshake again,
// and the function gives it a fresh token. A function that throws or rejects handshakes without a token.
api._withToken = function (use) {
  var token = this._options.token, value;
  if (typeof token !== 'function') return use(token);
  try { value = token.call(this); } catch (e) { report(e); return use(null); }
  if (value && typeof value.then === 'function') value.then(use, function (e) { report(e); use(null); });
  else use(value);
};

api._sendHandshake = function (message) {
  var self = this;
  this._send(message, function (reply) {
    if (self._state !== CONNECTING) return;
    if (!reply.successful) {
      self._state = UNCONNECTED;
      later(function () { self._handshake(); }, Math.max(self._advice.interval, self._retry));
      return;
    }
    self._state = CONNECTED;
    self._clientId = reply.clientId;
    self._resuming = false;  // every channel is subscribed again below, with ext.resume
    // pubsub's position of "now" (docs/PROTOCOL.md): where a channel subscribed in this session starts.
    self._position = reply.ext && typeof reply.ext.position === 'string' ? reply.ext.position : null;
    clearTimeout(self._retryTimer);
    self._retryTimer = null;
    self._serverTypes = reply.supportedConnectionTypes || [];
    self._transport = self._select();
    self._flushOutbox();
    for (var channel in self._channels) self._subscribe(channel);
    self._connect();
    self.trigger('connected');
  });
};

api._rehandshake = function (delay) {
  var self = this;
  this._state = UNCONNECTED;
  this._clientId = null;
  for (var channel in this._channels) this._channels[channel].active = false;
  later(function () { self._handshake(); }, delay);
};

api._connect = function () {
  if (this._state !== CONNECTED || this._connecting) return;
  var self = this;
  this._connecting = true;
  this._send({ channel: CONNECT, clientId: this._clientId, connectionType: this._transport.type }, function (reply) {
    self._connecting = false;
    if (self._state !== CONNECTED) return;
    var advice = self._advice;
    if (reply.successful) {
      later(function () { self._connect(); }, advice.interval);
    } else if (advice.reconnect === 'none') {
      self._state = DISCONNECTED;
      self._closeTransports();
    } else if (advice.reconnect === 'handshake') {
      self._rehandshake(advice.interval);
    } else {
      later(function () { self._connect(); }, Math.max(advice.interval, self._retry));
    }
  });
};

// A channel subscribed again after a new handshake asks for what it missed meanwhile: `ext.resume` with the
// position of the last message it got (pubsub's extension; Faye ignores it). On a broker spread over shards that
// position has a part per shard, each from the last message of that shard (`advance`). The broker answers whether
// all of it is coming; `resume` is triggered with the channel and that answer, so a page can refetch when it is not.
api._subscribe = function (channel) {
  var self = this, ch0 = this._channels[channel], from = ch0 && ch0.position;
  var message = { channel: SUBSCRIBE, clientId: this._clientId, subscription: channel };
  if (from) message.ext = { resume: from };
  this._send(message, function (reply) {
    var ch = self._channels[channel];
    if (!ch) return;
    if (reply.successful) {
      ch.active = true;
      if (!ch.position) ch.position = self._position;
      var resumed = reply.ext && reply.ext.resume;
      // What is gone stays gone: unless a message moved it on meanwhile, the channel goes on from the new session's
      // handshake position, so that a later resume does not report the same gap again.
      if (resumed && resumed.recovered === false && self._position && ch.position === from) ch.position = self._position;
      if (message.ext && resumed) self.trigger('resume', channel, resumed);
      each(ch.subs, function (sub) { sub._resolve(); });
      return;
    }
    var error = new BayeuxError(reply.error);
    if (error.code === 401) {
      // The session is gone: this channel is subscribed again after the next handshake.
      if (self._state === CONNECTED && reply.clientId === self._clientId) self._rehandshake(0);
      return;
    }
    delete self._channels[channel];
    each(ch.subs, function (sub) { sub._reject(error); });
    self.trigger('error', error, channel);
  });
};

// The first connect after a transport failed on the same session (a WebSocket closed, a polling request failed):
// every subscribed channel is subscribed again with `ext.resume` from the position of its last message, in the same
// frame or request as the connect and before it, so that the broker queues what was missed before anything newer
// (and drops from the session's queue what that range covers). `resume` is triggered with each answer.
api._resumeThenConnect = function (transport, connect) {
  var self = this, names = [], envs = [], left;
  this._resuming = false;
  for (var name in this._channels) {
    if (this._channels[name].active && this._channels[name].position) names.push(name);
  }
  left = names.length;
  if (!left) return transport.send(connect);
  each(names, function (name) {
    var message = { channel: SUBSCRIBE, clientId: this._clientId, subscription: name,
                    ext: { resume: this._channels[name].position }, id: (++this._ids).toString(36) };
    this._pending[message.id] = function (reply) { self._resumed(name, reply); };
    this._pipe('outgoing', message, function (msg) {
      if (msg) {
        msg.clientId = self._clientId;
        envs.push({ msg: msg, json: JSON.stringify(msg), resume: true });
      } else {
        delete self._pending[message.id];
      }
      if (--left) return;
      envs.push(connect);
      transport.send({ group: envs });
    });
  }, this);
};

api._resumed = function (channel, reply) {
  var ch = this._channels[channel];
  if (!ch) return;
  if (!reply.successful) {
    // 401: the session is gone; the connect is told so too, and the new session resumes every channel.
    if (new BayeuxError(reply.error).code !== 401) this.trigger('resume', channel, { recovered: false, missed: 0 });
    return;
  }
  var resumed = reply.ext && reply.ext.resume;
  if (resumed) this.trigger('resume', channel, resumed);
};

api._cancel = function (sub) {
  var ch = this._channels[sub._channel], i = ch ? ch.subs.indexOf(sub) : -1;
  if (i < 0) return;
  ch.subs.splice(i, 1);
  if (ch.subs.length) return;
  delete this._channels[sub._channel];
  if (this._state === CONNECTED) this._send({ channel: UNSUBSCRIBE, clientId: this._clientId, subscription: sub._channel });
};

api._closeTransports = function () {
  if (this._socket) this._socket.close();
  this._socket = null;
  this._transport = null;
};

// -- sending: extensions, then the current transport, or the outbox while there is no session

api._send = function (message, callback) {
  var self = this;
  message.id = (++this._ids).toString(36);
  this._pipe('outgoing', message, function (msg) {
    if (!msg) return;
    if (callback) self._pending[msg.id] = callback;
    self._transmit({ msg: msg, seq: ++self._seq });
  });
};

api._transmit = function (env) {
  var channel = env.msg.channel;
  if (channel === HANDSHAKE) return this._write(this._polling(), env);
  if (channel === DISCONNECT) return this._transport && this._write(this._transport, env);
  if (this._state !== CONNECTED || this._retryTimer) return this._outbox.push(env);
  this._write(this._transport, env);
};

api._write = function (transport, env) {
  var msg = env.msg;
  if (msg.channel !== HANDSHAKE) msg.clientId = this._clientId;
  if (msg.channel === CONNECT) msg.connectionType = transport.type;
  env.json = JSON.stringify(msg);
  if (msg.channel === CONNECT && this._resuming) return this._resumeThenConnect(transport, env);
  transport.send(env);
};

api._flushOutbox = function () {
  if (this._state !== CONNECTED || this._retryTimer) return;
  var queue = this._outbox.sort(bySeq);
  this._outbox = [];
  each(queue, function (env) { this._write(this._transport, env); }, this);
};

// A transport could not deliver `envs`. A WebSocket that never opened is given up for this session (a proxy
// may block it) and the messages go out by HTTP at once; otherwise they are sent again after `retry`.
api._failed = function (transport, envs, neverOpened) {
  var self = this;
  if (this._state === DISCONNECTED) return;
  // Resume subscribes are not sent again as they were: the next connect makes them afresh, from the latest positions.
  envs = envs.filter(function (env) {
    if (!env.resume) return true;
    delete self._pending[env.msg.id];
    self._resuming = true;
    return false;
  });
  if (neverOpened && transport.type === WS) {
    this._wsBroken = true;
    if (this._transport === transport) this._transport = this._polling();
    this._socket = null;
    each(envs.sort(bySeq), this._transmit, this);
    return;
  }
  this._setUp(false);
  if (this._state === CONNECTED) this._resuming = true;
  each(envs, function (env) {
    if (env.msg.channel === HANDSHAKE) later(function () { self._transmit(env); }, self._retry);
    else self._outbox.push(env);
  });
  if (!this._retryTimer) this._retryTimer = later(function () {
    self._retryTimer = null;
    self._flushOutbox();
  }, this._retry);
};

// The server refused a request outright (HTTP 4xx): its messages fail instead of being sent again.
api._rejectAll = function (envs, status) {
  this._setUp(true);
  each(envs, function (env) {
    this._handle({ id: env.msg.id, channel: env.msg.channel, successful: false, error: status + '::Bad request' });
  }, this);
};

api._setUp = function (up) {
  if (this._up === up) return;
  this._up = up;
  this.trigger(up ? 'transport:up' : 'transport:down');
};

// -- receiving: extensions in arrival order, then replies to their callbacks and events to subscribers

api._receive = function (list) {
  var self = this;
  this._setUp(true);
  if (!(list instanceof Array)) list = [list];
  each(list, function (message) {
    this._pipe('incoming', message, function (msg) { self._handle(msg); });
  }, this);
};

api._handle = function (message) {
  if (!message || typeof message !== 'object') return;
  if (message.advice) {
    for (var key in message.advice) this._advice[key] = message.advice[key];
  }
  if ('successful' in message) {
    var callback = this._pending[message.id];
    delete this._pending[message.id];
    if (callback) callback(message);
  } else if (message.channel && 'data' in message && !isMeta(message.channel)) {
    var position = message.ext && typeof message.ext.position === 'string' ? message.ext.position : null;
    if (position && !this._recent.add(position)) return;  // sent again after a reconnect: delivered already
    each(expand(message.channel), function (name) {
      var ch = this._channels[name];
      if (!ch) return;
      // Before the subscribe's answer the channel has no position yet: it starts from the handshake's.
      if (position) ch.position = advance(ch.position || this._position, position);
      each(ch.subs.slice(), function (sub) { sub._call(message); });
    }, this);
  }
};

// Runs each message through the extensions' `stage` hook in the order they were added. Messages leave the
// pipe in the order they entered it, even when an extension answers asynchronously.
api._pipe = function (stage, message, done) {
  var queue = this._pipes[stage];
  queue.push([message, done]);
  if (queue.length === 1) this._drain(stage);
};

api._drain = function (stage) {
  var self = this, queue = this._pipes[stage];
  while (queue.length) {
    var sync = true, finished = false;
    this._through(stage, queue[0][0], function (msg) {
      var item = queue.shift();
      try { item[1](msg); } catch (e) { report(e); }
      finished = true;
      if (!sync) self._drain(stage);
    });
    sync = false;
    if (!finished) return;
  }
};

api._through = function (stage, message, done) {
  var extensions = this._extensions.slice(), i = 0;
  function step(msg) {
    if (!msg || i >= extensions.length) return done(msg);
    var extension = extensions[i++], fn = extension[stage], called = false;
    if (typeof fn !== 'function') return step(msg);
    var next = function (m) { if (!called) { called = true; step(m); } };
    try {
      if (fn.length >= 3) fn.call(extension, msg, null, next);
      else fn.call(extension, msg, next);
    } catch (e) {
      report(e);
      next(msg);
    }
  }
  step(message);
};

var Faye = global.Faye = global.Faye || {};
Faye.Client = Client;
Faye.Subscription = Subscription;
Faye.Error = BayeuxError;
})(typeof window !== 'undefined' ? window : this);
