/* The playground: chat with a ready model through the routers, streamed.

   The page asks the control plane only for the user's own short-lived key; every request
   goes to the routers (LLMGW_ROUTER_URL), which answer this origin's CORS preflights when
   LLMGW_ROUTER_CORS_ORIGINS names it. The answer is read as server-sent events with a
   ReadableStream reader, so each token shows as it arrives. */
(function () {
  "use strict";

  var root = document.getElementById("playground");
  if (!root) return;
  var routerUrl = root.dataset.routerUrl;
  var keyUrl = root.dataset.keyUrl;
  var form = document.getElementById("chat-form");
  var transcript = document.getElementById("transcript");
  var sendButton = document.getElementById("chat-send");
  var stopButton = document.getElementById("chat-stop");
  var messages = [];
  var key = null;
  var controller = null;

  function csrfToken() {
    try {
      return JSON.parse(document.body.getAttribute("hx-headers") || "{}")["X-CSRFToken"] || "";
    } catch (error) {
      return "";
    }
  }

  function show(id, text) {
    document.getElementById(id).textContent = text;
  }

  function milliseconds(ms) {
    return ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : Math.round(ms) + " ms";
  }

  // The key lives here, in memory, and is reused while it stays good for a minute more; the
  // server keeps only its hash, so each ask is a new key (the user's previous one revoked).
  async function playgroundKey() {
    if (key && Date.parse(key.expires_at) - Date.now() > 60000) return key.key;
    var response = await fetch(keyUrl, {
      method: "POST",
      headers: { "X-CSRFToken": csrfToken() },
      credentials: "same-origin",
    });
    if (!response.ok) {
      var why = "HTTP " + response.status;
      try { why = (await response.json()).error || why; } catch (e) { /* not JSON: 403's text */ }
      throw new Error("could not get a playground key: " + why);
    }
    key = await response.json();
    key.receivedAt = Date.now();
    return key.key;
  }

  // Routers hear of a new key within a second or so: one drawn a moment ago may be refused
  // until then, so it is tried again for a few seconds. A key refused later was revoked
  // (renewed in another tab: one live key per user) or expired behind the page's back: a
  // new one is asked for, once.
  var NEW_KEY_MS = 10000;
  async function ask(body, signal, sent) {
    var renewed = false;
    for (;;) {
      var authorization = "Bearer " + (await playgroundKey());
      sent.at = performance.now(); // the request that is answered is the one timed
      var response = await fetch(routerUrl + "/v1/chat/completions", {
        method: "POST",
        headers: {
          "Authorization": authorization,
          "Content-Type": "application/json",
        },
        body: JSON.stringify(body),
        signal: signal,
      });
      if (response.status !== 401) return response;
      if (key && Date.now() - key.receivedAt < NEW_KEY_MS) {
        await new Promise(function (resolve) { setTimeout(resolve, 500); });
      } else if (!renewed) {
        key = null;
        renewed = true;
      } else {
        return response;
      }
    }
  }

  function bubble(role, text) {
    var item = document.createElement("div");
    item.className = "message " + role;
    item.dataset.role = role;
    var who = document.createElement("strong");
    who.textContent = role === "user" ? "you" : role;
    var body = document.createElement("div");
    body.className = "content";
    body.textContent = text;
    item.append(who, body);
    transcript.append(item);
    transcript.scrollTop = transcript.scrollHeight;
    return item;
  }

  function requestBody(data) {
    var body = {
      model: data.get("model"),
      messages: messages.slice(),
      stream: true,
      // The last chunk then carries the usage the engine counted.
      stream_options: { include_usage: true },
    };
    var system = (data.get("system") || "").trim();
    if (system) body.messages.unshift({ role: "system", content: system });
    [["temperature", parseFloat], ["top_p", parseFloat], ["max_tokens", parseInt]].forEach(
      function (pair) {
        var value = pair[1](data.get(pair[0]));
        if (!isNaN(value)) body[pair[0]] = value;
      }
    );
    return body;
  }

  // What was asked, as sent, the conversation shortened to its size.
  function describeRequest(body) {
    var shown = Object.assign({}, body, { messages: body.messages.length + " message(s)" });
    return "POST " + routerUrl + "/v1/chat/completions\n" + JSON.stringify(shown, null, 2);
  }

  // Split a server-sent event stream into the data of each event.
  async function* events(response) {
    var reader = response.body.getReader();
    var decoder = new TextDecoder();
    var buffer = "";
    for (;;) {
      var read = await reader.read();
      if (read.done) break;
      buffer = (buffer + decoder.decode(read.value, { stream: true })).replace(/\r\n/g, "\n");
      var end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        var event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        var data = event
          .split("\n")
          .filter(function (line) { return line.startsWith("data:"); })
          .map(function (line) { return line.slice(5).replace(/^ /, ""); })
          .join("\n");
        if (data) yield data;
      }
    }
  }

  async function errorOf(response) {
    var text = await response.text();
    try {
      var error = JSON.parse(text).error;
      return (error && (error.message || error)) || text;
    } catch (ignored) {
      return text || "the router answered HTTP " + response.status;
    }
  }

  async function send(prompt, data) {
    messages.push({ role: "user", content: prompt });
    bubble("user", prompt);
    var answer = bubble("assistant", "");
    var content = answer.querySelector(".content");
    var body = requestBody(data);
    show("chat-request", describeRequest(body));
    ["chat-ttft", "chat-total", "chat-prompt-tokens", "chat-completion-tokens", "chat-rate",
      "chat-request-id"].forEach(function (id) { show(id, "…"); });
    controller = new AbortController();
    var sent = { at: performance.now() };
    var firstToken = null;
    var chunks = 0;
    var usage = null;
    try {
      var response = await ask(body, controller.signal, sent);
      show("chat-request-id", response.headers.get("x-request-id") || "—");
      if (!response.ok) throw new Error(await errorOf(response));
      for await (var data of events(response)) {
        if (data === "[DONE]") break;
        var chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
        if (chunk.usage) usage = chunk.usage;
        var delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          if (firstToken === null) {
            firstToken = performance.now() - sent.at;
            show("chat-ttft", milliseconds(firstToken));
          }
          chunks += 1;
          content.textContent += delta.content;
          answer.dataset.chunks = String(chunks);
          transcript.scrollTop = transcript.scrollHeight;
        }
      }
      messages.push({ role: "assistant", content: content.textContent });
      answer.dataset.done = "true";
    } catch (error) {
      answer.classList.add("error");
      var reason = error.name === "AbortError" ? "stopped" : error.message;
      if (error instanceof TypeError) {
        // What fetch says when the browser refused the answer (CORS) or reached nothing.
        reason = "could not reach the routers at " + routerUrl + " (" + error.message + "); " +
          "they must be up and list this page's origin in LLMGW_ROUTER_CORS_ORIGINS";
      }
      content.textContent += (content.textContent ? "\n" : "") + "[" + reason + "]";
      answer.dataset.done = "error";
      messages.pop(); // the question goes unanswered: ask it again
    } finally {
      var total = performance.now() - sent.at;
      show("chat-total", milliseconds(total));
      if (firstToken === null) show("chat-ttft", "—");
      show("chat-prompt-tokens", usage ? String(usage.prompt_tokens) : "—");
      show("chat-completion-tokens", usage ? String(usage.completion_tokens) : "—");
      var generating = (total - (firstToken || 0)) / 1000;
      show("chat-rate", usage && generating > 0 ?
        (usage.completion_tokens / generating).toFixed(1) : "—");
      controller = null;
    }
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    var data = new FormData(form);
    var prompt = (data.get("prompt") || "").trim();
    if (!prompt || controller) return;
    form.elements.prompt.value = "";
    sendButton.disabled = true;
    stopButton.disabled = false;
    try {
      await send(prompt, data);
    } finally {
      sendButton.disabled = false;
      stopButton.disabled = true;
    }
  });
  form.elements.prompt.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  stopButton.addEventListener("click", function () {
    if (controller) controller.abort();
  });
  document.getElementById("chat-clear").addEventListener("click", function () {
    messages = [];
    transcript.textContent = "";
  });
})();
