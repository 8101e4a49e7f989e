/// The dashboard at `/admin`: one page, inline CSS and JS, no external assets. It asks for the API key (kept in
/// the tab's `sessionStorage` only) and then talks only to `/api`. Everything from the server is put in the page
/// with `textContent`, never as HTML.
enum AdminPage {
    static let html = #"""
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>pubsub dashboard</title>
        <style>
        :root { --bg:#0f1419; --card:#1a2028; --line:#2a323d; --text:#e6e9ef; --dim:#8b95a5; --a:#4fc1ff; --b:#8bd66f; --c:#ff6b6b; }
        * { box-sizing: border-box; }
        body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; background:var(--bg); color:var(--text); }
        header { display:flex; align-items:center; gap:12px; padding:10px 16px; border-bottom:1px solid var(--line); flex-wrap:wrap; }
        header h1 { font-size:17px; margin:0; }
        header .dim { color:var(--dim); }
        main { display:grid; grid-template-columns:repeat(auto-fit, minmax(300px, 1fr)); gap:12px; padding:12px; }
        section { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:12px; min-width:0; }
        section h2 { font-size:13px; text-transform:uppercase; letter-spacing:.05em; color:var(--dim); margin:0 0 8px; }
        .wide { grid-column:1 / -1; }
        .big { display:flex; gap:18px; flex-wrap:wrap; }
        .big div { min-width:90px; } .big b { display:block; font-size:26px; } .big span { color:var(--dim); font-size:12px; }
        table { width:100%; border-collapse:collapse; } td, th { text-align:left; padding:4px 6px; border-bottom:1px solid var(--line); overflow-wrap:anywhere; }
        th { color:var(--dim); font-weight:normal; font-size:12px; white-space:nowrap; }
        tr.pick { cursor:pointer; } tr.pick:hover { background:#222b36; }
        td.n { text-align:right; font-variant-numeric:tabular-nums; }
        input, textarea, button { font:inherit; color:var(--text); background:#0f1419; border:1px solid var(--line); border-radius:6px; padding:7px 9px; }
        textarea { width:100%; min-height:60px; } input { width:100%; }
        button { background:#24507a; border-color:#2e6aa3; cursor:pointer; } button.secondary { background:transparent; }
        form.row { display:grid; gap:8px; }
        .legend span { margin-right:12px; font-size:12px; } .legend i { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:4px; }
        svg { width:100%; height:160px; display:block; }
        #errors li, #server-errors li { color:var(--c); overflow-wrap:anywhere; } ul { margin:0; padding-left:18px; }
        #login { max-width:420px; margin:12vh auto; padding:16px; }
        .hidden { display:none !important; }
        .ok { color:var(--b); }
        </style>
        </head>
        <body>
        <div id="login">
          <section>
            <h2>pubsub dashboard</h2>
            <form id="login-form" class="row">
              <label for="key">API key</label>
              <input id="key" type="password" autocomplete="current-password" required>
              <button type="submit">Open</button>
              <div id="login-error" style="color:var(--c)"></div>
            </form>
          </section>
        </div>
        <div id="app" class="hidden">
        <header><h1>pubsub</h1><span class="dim" id="status">connecting…</span><span style="flex:1"></span><button class="secondary" id="logout">Forget key</button></header>
        <main>
          <section class="wide"><h2>Now</h2><div class="big" id="totals"></div></section>
          <section class="wide"><h2>Per second, last minutes</h2>
            <div class="legend"><span><i style="background:var(--a)"></i>publishes</span><span><i style="background:var(--b)"></i>deliveries</span><span><i style="background:var(--c)"></i>drops</span><span class="dim" id="peak"></span></div>
            <svg id="plot" viewBox="0 0 600 160" preserveAspectRatio="none" role="img" aria-label="rates"></svg></section>
          <section><h2>Clients by transport</h2><table><tbody id="transports"></tbody></table></section>
          <section><h2>Busiest channels</h2><table><thead><tr><th>channel</th><th class="n">subscribers</th></tr></thead><tbody id="channels"></tbody></table></section>
          <section><h2>Presence <span id="presence-channel"></span></h2><table><thead><tr><th>client</th><th>user</th><th>transport</th><th>since</th></tr></thead><tbody id="presence"></tbody></table></section>
          <section><h2>Nodes</h2><table><thead><tr><th>node</th><th class="n">up</th><th class="n">clients</th><th class="n">subs</th><th class="n">pub/s</th></tr></thead><tbody id="nodes"></tbody></table></section>
          <section><h2>Publish</h2>
            <form id="publish" class="row">
              <input id="pub-channel" placeholder="/channel" required>
              <textarea id="pub-data" placeholder='{"text": "hello"}' required></textarea>
              <button type="submit">Publish</button><div id="pub-result"></div>
            </form></section>
          <section><h2>Last errors</h2><ul id="errors"></ul><h2 style="margin-top:10px">Requests refused by this node</h2><ul id="server-errors"></ul></section>
        </main>
        </div>
        <script>
        (function () {
          "use strict";
          var key = sessionStorage.getItem("pubsub.apiKey") || "";
          var selected = null, errors = [], timer = null;
          function $(id) { return document.getElementById(id); }
          function el(tag, text, cls) { var e = document.createElement(tag); if (text !== undefined) e.textContent = String(text); if (cls) e.className = cls; return e; }
          function rows(tbody, list, make) { tbody.replaceChildren.apply(tbody, list.map(make)); }
          function row(cells, numeric) { var tr = el("tr"); cells.forEach(function (c, i) { tr.appendChild(el("td", c, numeric && numeric.indexOf(i) >= 0 ? "n" : "")); }); return tr; }
          function noteError(message) {
            errors.unshift(new Date().toLocaleTimeString() + "  " + message); errors = errors.slice(0, 10);
            rows($("errors"), errors, function (e) { return el("li", e); });
          }
          function api(method, call, body) {
            var init = { method: method, headers: { "Authorization": "apikey " + key }, cache: "no-store" };
            if (body !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
            return fetch("/api/" + call, init).then(function (r) {
              return r.json().catch(function () { return {}; }).then(function (json) {
                if (r.status === 401) { logout("The key was refused."); throw new Error("401"); }
                if (!r.ok) throw new Error(call + ": " + (json.error || ("HTTP " + r.status)));
                return json;
              });
            });
          }
          function show(loggedIn) { $("login").classList.toggle("hidden", loggedIn); $("app").classList.toggle("hidden", !loggedIn); }
          function logout(why) {
            key = ""; sessionStorage.removeItem("pubsub.apiKey"); clearInterval(timer); timer = null;
            $("login-error").textContent = why || ""; show(false);
          }
          function big(label, value) { var d = el("div"); d.appendChild(el("b", value)); d.appendChild(el("span", label)); return d; }
          function plot(series) {
            var svg = $("plot"), w = 600, h = 160, ns = "http://www.w3.org/2000/svg";
            var keys = [["publishes", "var(--a)"], ["deliveries", "var(--b)"], ["drops", "var(--c)"]];
            var max = 1; series.forEach(function (p) { keys.forEach(function (k) { max = Math.max(max, p[k[0]]); }); });
            $("peak").textContent = "peak " + max.toFixed(1) + "/s";
            var n = Math.max(series.length - 1, 1);
            svg.replaceChildren.apply(svg, keys.map(function (k) {
              var path = document.createElementNS(ns, "polyline");
              path.setAttribute("fill", "none"); path.setAttribute("stroke", k[1]); path.setAttribute("stroke-width", "2");
              path.setAttribute("vector-effect", "non-scaling-stroke");
              path.setAttribute("points", series.map(function (p, i) { return (i * w / n).toFixed(1) + "," + (h - 2 - (p[k[0]] / max) * (h - 6)).toFixed(1); }).join(" "));
              path.setAttribute("data-series", k[0]);
              return path;
            }));
          }
          function presence(channel) {
            selected = channel; $("presence-channel").textContent = channel;
            return api("GET", "presence?channel=" + encodeURIComponent(channel)).then(function (p) {
              rows($("presence"), p.clients, function (c) { return row([c.clientId, c.user === null ? "–" : c.user, c.transport || "–", new Date(c.since).toLocaleTimeString()]); });
            });
          }
          function refresh() {
            return Promise.all([api("GET", "info"), api("GET", "channels"), api("GET", "rates"), api("GET", "errors")]).then(function (all) {
              var info = all[0], channels = all[1].channels, series = all[2].series;
              rows($("server-errors"), all[3].errors.slice(0, 10), function (e) { return el("li", new Date(e.at).toLocaleTimeString() + "  " + e.kind.replace(/_/g, " ")); });
              var byTransport = {}, subs = 0, pub = 0, deliv = 0, drops = 0;
              info.nodes.forEach(function (n) {
                Object.keys(n.clients).forEach(function (t) { byTransport[t] = (byTransport[t] || 0) + n.clients[t]; });
                subs += n.subscriptions; pub += n.rates.publishesPerSecond; deliv += n.rates.deliveriesPerSecond; drops += n.rates.dropsPerSecond;
              });
              $("totals").replaceChildren(big("clients", info.clients), big("subscriptions", subs), big("channels", channels.length),
                big("publishes/s", pub.toFixed(1)), big("deliveries/s", deliv.toFixed(1)), big("drops/s", drops.toFixed(1)), big("nodes", info.nodes.length));
              $("totals").firstChild.id = "clients-total";
              rows($("transports"), Object.keys(byTransport).sort(), function (t) { return row([t, byTransport[t]], [1]); });
              rows($("channels"), channels.slice(0, 15), function (c) {
                var tr = row([c.channel, c.subscribers], [1]); tr.className = "pick"; tr.title = "presence";
                tr.addEventListener("click", function () { presence(c.channel).catch(function (e) { noteError(e.message); }); });
                return tr;
              });
              rows($("nodes"), info.nodes, function (n) { return row([n.id, n.uptimeSeconds + "s", n.sessions, n.subscriptions, n.rates.publishesPerSecond], [1, 2, 3, 4]); });
              plot(series);
              $("status").textContent = "updated " + new Date().toLocaleTimeString();
              $("status").className = "ok";
              if (selected) return presence(selected);
            }).catch(function (e) { if (e.message !== "401") { $("status").textContent = "offline"; $("status").className = ""; noteError(e.message); } });
          }
          function start() { show(true); refresh(); timer = setInterval(refresh, 2000); }
          $("login-form").addEventListener("submit", function (ev) {
            ev.preventDefault(); key = $("key").value.trim(); $("key").value = "";
            api("GET", "info").then(function () { sessionStorage.setItem("pubsub.apiKey", key); start(); })
              .catch(function (e) { if (e.message !== "401") $("login-error").textContent = e.message; });
          });
          $("logout").addEventListener("click", function () { logout(""); });
          $("publish").addEventListener("submit", function (ev) {
            ev.preventDefault();
            var data;
            try { data = JSON.parse($("pub-data").value); } catch (e) { noteError("publish: data is not JSON"); return; }
            api("POST", "publish", { channel: $("pub-channel").value.trim(), data: data }).then(function (r) {
              $("pub-result").textContent = "published" + (r.position ? " at " + r.position : ""); $("pub-result").className = "ok";
            }).catch(function (e) { $("pub-result").textContent = ""; noteError(e.message); });
          });
          if (key) start(); else show(false);
        })();
        </script>
        </body>
        </html>
        """#
}
