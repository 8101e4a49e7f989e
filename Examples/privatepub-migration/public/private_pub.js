// The browser side of PrivatePub, as the private_pub gem ships it in app/assets/javascripts/private_pub.js.
// In your app keep the gem's own file: nothing in it changes. This copy is written from the behaviour described
// in docs (PROTOCOL.md section 7.5) so that the example runs without Ruby.
function buildPrivatePub(doc) {
  var self = {
    connecting: false,
    fayeClient: null,
    fayeCallbacks: [],
    subscriptions: {},
    subscriptionObjects: {},
    subscriptionCallbacks: {},

    // Loads <server>.js once, then hands the Faye client to every waiting callback.
    faye: function (callback) {
      if (self.fayeClient) return callback(self.fayeClient);
      self.fayeCallbacks.push(callback);
      if (self.subscriptions.server && !self.connecting) {
        self.connecting = true;
        var script = doc.createElement("script");
        script.type = "text/javascript";
        script.src = self.subscriptions.server + ".js";
        script.onload = self.connectToFaye;
        doc.documentElement.appendChild(script);
      }
    },

    connectToFaye: function () {
      self.fayeClient = new Faye.Client(self.subscriptions.server);
      self.fayeClient.addExtension(self.fayeExtension);
      for (var i = 0; i < self.fayeCallbacks.length; i++) self.fayeCallbacks[i](self.fayeClient);
    },

    // Adds the signature made by the server (subscribe_to) to each /meta/subscribe.
    fayeExtension: {
      outgoing: function (message, callback) {
        if (message.channel == "/meta/subscribe") {
          var subscription = self.subscriptions[message.subscription];
          if (!message.ext) message.ext = {};
          message.ext.private_pub_signature = subscription.signature;
          message.ext.private_pub_timestamp = subscription.timestamp;
        }
        callback(message);
      }
    },

    sign: function (options) {
      if (!self.subscriptions.server) self.subscriptions.server = options.server;
      self.subscriptions[options.channel] = options;
      self.faye(function (faye) {
        var sub = faye.subscribe(options.channel, self.handleResponse);
        self.subscriptionObjects[options.channel] = sub;
        if (options.subscription) options.subscription(sub);
      });
    },

    handleResponse: function (message) {
      if (message.eval) eval(message.eval);
      var callback = self.subscriptionCallbacks[message.channel];
      if (callback) callback(message.data, message.channel);
    },

    subscription: function (channel) { return self.subscriptionObjects[channel]; },

    unsubscribeAll: function () {
      for (var channel in self.subscriptionObjects) {
        if (self.subscriptionObjects.hasOwnProperty(channel)) self.unsubscribe(channel);
      }
    },

    unsubscribe: function (channel) {
      var sub = self.subscription(channel);
      if (sub) {
        sub.cancel();
        delete self.subscriptionObjects[channel];
      }
    },

    subscribe: function (channel, callback) { self.subscriptionCallbacks[channel] = callback; }
  };
  return self;
}

var PrivatePub = buildPrivatePub(document);
