"""OpenAI's Responses API on chat completions: requests in, answers and errors out.

``to_chat`` reads a Responses request (``instructions``, ``input`` as text or items:
messages, function calls and their outputs; function tools, tool_choice, sampling,
``text.format``) into a chat completions body. What only a stateful or hosted service can
do (``previous_response_id``, ``conversation``, ``background``, stored prompts, item
references, hosted tools such as web_search) is a 400 naming it; so is every field of
the wrong shape. Fields that tune OpenAI's own service (``store``, ``reasoning``,
``include``, ``truncation``…) are dropped, as are unknown ones. Reasoning items a client
sends back are dropped too: the engine reasons anew each turn. ``from_chat`` turns the
engine's chat completion into a Response, and ``error_body`` any error body into
OpenAI's shape with a string ``code``. The stream is response_events.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

from router import errors
from router.translate import shapes
from router.translate.chat import (
    EngineError,
    first_choice,
    merge_turns,
    new_id,
    object_at,
    read_error_body,
    tool_calls_of,
)
from router.translate.response_events import (
    INCOMPLETE,
    ResponseEvents,
    failure_event,
    function_item,
    message_item,
    response_json,
    usage_json,
)
from router.translate.shapes import refuse

NATIVE = "; send it to a model whose engine serves /v1/responses itself"
HOSTED_TOOLS = (" Hosted tools (web_search, file_search…) run on OpenAI's servers; this "
                f"model's engine calls functions only{NATIVE}.")  # fmt: skip
STATEFUL = ("previous_response_id", "conversation")
ROLES = ("user", "assistant", "system", "developer")
ITEMS = ("message", "function_call", "function_call_output", "reasoning")
INPUT_PARTS = ("input_text", "input_image")
OUTPUT_PARTS = ("output_text", "input_text", "refusal")
FORMATS = ("text", "json_object", "json_schema")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
ERROR_CODES = {400: "invalid_request", 401: "invalid_api_key", 403: "permission_denied",
               404: "not_found", 413: "request_too_large", 429: "rate_limit_exceeded"}  # fmt: skip


def to_chat(payload: Any) -> dict[str, Any]:
    """The chat completions body that asks an engine what ``payload`` asks /v1/responses."""
    payload = shapes.obj(payload, "body")
    for name in STATEFUL:
        if payload.get(name) is not None:
            refuse(name, f"`{name}` needs the state of an earlier response{NATIVE}.")
    if payload.get("prompt") is not None:
        refuse("prompt", "`prompt` names a prompt stored at OpenAI, which this model's engine "
               "cannot read; send the prompt's text as `instructions` and `input`.")  # fmt: skip
    background = payload.get("background")
    if background is not None and shapes.flag(background, "background"):
        refuse("background", f"`background` answers are polled for later{NATIVE}.")
    chat: dict[str, Any] = {}
    if "model" in payload:
        chat["model"] = shapes.text(payload["model"], "model")
    messages = []
    if payload.get("instructions") is not None:
        instructions = shapes.text(payload["instructions"], "instructions")
        messages.append({"role": "system", "content": instructions})
    given = payload.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    else:
        for i, item in enumerate(shapes.array(given, "input", empty=False)):
            messages += _item(item, f"input[{i}]")
    if not any(message["role"] != "system" for message in messages):
        refuse("input", "`input` holds nothing to answer (only instructions or reasoning).")
    chat["messages"] = merge_turns(messages)
    if payload.get("max_output_tokens") is not None:
        chat["max_tokens"] = shapes.count(payload["max_output_tokens"], "max_output_tokens")
    for name in ("temperature", "top_p"):
        if payload.get(name) is not None:
            chat[name] = shapes.number(payload[name], name)
    if payload.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = shapes.flag(payload["parallel_tool_calls"],
                                                  "parallel_tool_calls")  # fmt: skip
    _tools(payload, chat)
    _text_format(payload, chat)
    for name in ("user", "safety_identifier"):
        if payload.get(name) is not None:
            chat["user"] = shapes.text(payload[name], name)
    if payload.get("stream") is not None and shapes.flag(payload["stream"], "stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _item(item: Any, where: str) -> list[dict[str, Any]]:
    """One input item as chat messages (none for a reasoning item)."""
    item = shapes.obj(item, where)
    kind = item.get("type", "message")
    if kind == "item_reference":
        refuse(f"{where}.type", f"`{where}.type` item_reference refers to a stored item{NATIVE}.")
    kind = shapes.one_of(kind, f"{where}.type", ITEMS, HOSTED_TOOLS)
    if kind == "reasoning":
        return []
    if kind == "function_call":
        call = {
            "id": shapes.text(item.get("call_id"), f"{where}.call_id"),
            "type": "function",
            "function": {"name": shapes.text(item.get("name"), f"{where}.name"),
                         "arguments": shapes.text(item.get("arguments"), f"{where}.arguments")},
        }  # fmt: skip
        return [{"role": "assistant", "content": "", "tool_calls": [call]}]
    if kind == "function_call_output":
        call_id = shapes.text(item.get("call_id"), f"{where}.call_id")
        output = item.get("output")
        content = output if isinstance(output, str) else _parts(output, f"{where}.output", "user")
        return [{"role": "tool", "tool_call_id": call_id, "content": content}]
    role = shapes.one_of(item.get("role"), f"{where}.role", ROLES)
    content = item.get("content")
    if not isinstance(content, str):
        content = _parts(content, f"{where}.content", role)
    if role != "user" and not isinstance(content, str):
        # Chat templates read these as text: an image here has nowhere to go.
        refuse(f"{where}.content", f"`{where}.content`: a {role} message holds text only.")
    return [{"role": "system" if role == "developer" else role, "content": content}]


def _parts(parts: Any, where: str, role: str) -> str | list[dict[str, Any]]:
    """Content parts as chat's: text alone as one string, which every engine takes."""
    allowed = OUTPUT_PARTS if role == "assistant" else INPUT_PARTS
    converted: list[dict[str, Any]] = []
    for i, part in enumerate(shapes.array(parts, where)):
        at = f"{where}[{i}]"
        part = shapes.obj(part, at)
        kind = shapes.one_of(part.get("type"), f"{at}.type", allowed,
                             " Files cannot reach this model's engine.")  # fmt: skip
        if kind == "input_image":
            if part.get("image_url") is None:
                refuse(f"{at}.image_url", f"`{at}.image_url` is required: uploaded files "
                       "(`file_id`) cannot reach this model's engine.")  # fmt: skip
            url = shapes.text(part["image_url"], f"{at}.image_url")
            converted.append({"type": "image_url", "image_url": {"url": url}})
        else:
            field = "refusal" if kind == "refusal" else "text"
            converted.append(
                {"type": "text", "text": shapes.text(part.get(field), f"{at}.{field}")}
            )
    if all(part["type"] == "text" for part in converted):
        return "".join(part["text"] for part in converted)
    return converted


def _tools(payload: dict[str, Any], chat: dict[str, Any]) -> None:
    tools = {}
    for i, tool in enumerate(shapes.array(payload.get("tools") or [], "tools")):
        where = f"tools[{i}]"
        tool = shapes.obj(tool, where)
        shapes.one_of(tool.get("type"), f"{where}.type", ("function",), HOSTED_TOOLS)
        name = shapes.text(tool.get("name"), f"{where}.name")
        function: dict[str, Any] = {"name": name}
        if tool.get("parameters") is not None:
            function["parameters"] = shapes.obj(tool["parameters"], f"{where}.parameters")
        if tool.get("description") is not None:
            function["description"] = shapes.text(tool["description"], f"{where}.description")
        if tool.get("strict") is not None:
            function["strict"] = shapes.flag(tool["strict"], f"{where}.strict")
        tools[name] = {"type": "function", "function": function}
    choice = payload.get("tool_choice")
    mode = "auto"
    if isinstance(choice, str):
        mode = shapes.one_of(choice, "tool_choice", ("auto", "none", "required"))
    elif choice is not None:
        tools, mode = _named_choice(shapes.obj(choice, "tool_choice"), tools)
    if tools:
        chat["tools"] = list(tools.values())
        if choice is not None:
            chat["tool_choice"] = mode


def _named_choice(choice: dict[str, Any], tools: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A choice of certain functions, said the way every engine understands: only those
    tools, and ``required`` (or ``auto`` for allowed_tools in auto mode)."""
    kind = shapes.one_of(choice.get("type"), "tool_choice.type", ("function", "allowed_tools"),
                         HOSTED_TOOLS)  # fmt: skip
    if kind == "function":
        names = [shapes.text(choice.get("name"), "tool_choice.name")]
        mode = "required"
    else:
        mode = shapes.one_of(choice.get("mode"), "tool_choice.mode", ("auto", "required"))
        names = []
        for i, allowed in enumerate(shapes.array(choice.get("tools"), "tool_choice.tools")):
            names.append(shapes.text(shapes.obj(allowed, f"tool_choice.tools[{i}]").get("name"),
                                     f"tool_choice.tools[{i}].name"))  # fmt: skip
    for name in names:
        if name not in tools:
            refuse("tool_choice", f"`tool_choice` names {name!r}, which is not in `tools`.")
    return {name: tools[name] for name in names}, mode


def _text_format(payload: dict[str, Any], chat: dict[str, Any]) -> None:
    text = payload.get("text")
    if text is None or shapes.obj(text, "text").get("format") is None:
        return
    form = shapes.obj(text["format"], "text.format")
    kind = shapes.one_of(form.get("type"), "text.format.type", FORMATS)
    if kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif kind == "json_schema":
        schema: dict[str, Any] = {"name": shapes.text(form.get("name"), "text.format.name"),
                  "schema": shapes.obj(form.get("schema"), "text.format.schema")}  # fmt: skip
        if form.get("strict") is not None:
            schema["strict"] = shapes.flag(form["strict"], "text.format.strict")
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}


# -- answers ----------------------------------------------------------------------------


def from_chat(answer: dict[str, Any], model: str,
              request: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The Response for an engine's chat completion; ``request`` (the client's, already
    read by ``to_chat``) is echoed in it."""
    choice = first_choice(answer)
    if not choice:
        raise errors.bad_gateway(f"The engine of {model} answered without a choice.")
    message = object_at(choice, "message")
    finish = choice.get("finish_reason")
    incomplete = INCOMPLETE.get(finish) if isinstance(finish, str) else None
    output = []
    text = message.get("content")
    if isinstance(text, str) and text:
        status = "incomplete" if incomplete else "completed"
        output.append(message_item(new_id("msg_"), text, status))
    for call_id, name, arguments in tool_calls_of(message):
        output.append(function_item(new_id("fc_"), call_id, name, arguments, "completed"))
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
    return response_json(new_id("resp_"), model, int(time.time()),
                         "incomplete" if incomplete else "completed", output, request,
                         usage=usage_json(usage), incomplete=incomplete)  # fmt: skip


# -- errors -----------------------------------------------------------------------------


def error_body(status: int, body: bytes) -> bytes:
    """Any error answer (llama-server's numeric ``code``, plain text…) in OpenAI's shape,
    with a string ``code``, which the openai SDK needs to tell a client's error from a
    server's."""
    error = read_error_body(status, body)
    fallback = "server_error" if status >= 500 else "invalid_request_error"
    code = error.code or ERROR_CODES.get(status) or ("server_error" if status >= 500 else
                                                     "invalid_request")  # fmt: skip
    shaped = {"message": error.message, "type": error.type or ERROR_TYPES.get(status, fallback),
              "param": error.param, "code": code}  # fmt: skip
    return json.dumps({"error": shaped}, ensure_ascii=False).encode()


def stream_translator(model: str, request: dict[str, Any] | None = None) -> ResponseEvents:
    """The engine's chat stream, told as ``model``'s Responses stream; ``request`` (the
    client's body) is echoed in the response."""
    return ResponseEvents(model, request)


def stream_error_event(message: str) -> bytes:
    """How a stream that already began ends on the router's own failure, where no
    translator knows the response: the ``error`` event. (A translated stream ends better
    by feeding the router's error event to its translator: ``response.failed``.)"""
    return failure_event(EngineError(None, None, None, message), 0, None)
