"""Anthropic's Messages API on chat completions: requests in, answers and errors out.

``to_chat`` reads an Anthropic request (system, text, images, tool use and results,
tools, tool_choice, sampling) into a chat completions body; every field it cannot serve
or finds of the wrong shape is a 400 naming it. Fields that only tune Anthropic's own
service (``thinking``, ``cache_control``, ``service_tier``, ``metadata`` but its user…)
are dropped, as are unknown ones: a newer client's extra field should not cost an answer.
``from_chat`` turns the engine's chat completion into a Message, and ``error_body`` any
error body into Anthropic's. The stream is message_events.py.
"""

from __future__ import annotations

import json
from typing import Any

from router import errors
from router.translate import shapes
from router.translate.chat import (
    CONTINUE_FINAL_MESSAGE,
    EngineError,
    first_choice,
    matched_stop,
    merge_turns,
    new_id,
    object_at,
    read_error_body,
    tool_calls_of,
)
from router.translate.message_events import (
    MessageEvents,
    error_event,
    error_json,
    stop_reason,
    usage_json,
)
from router.translate.shapes import refuse
from router.wire.tokens import Tokens, tokens_of

# Thinking blocks a client sends back are dropped: the engine thinks anew each turn.
BLOCKS = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")
TOOL_CHOICES = ("auto", "any", "tool", "none")
NATIVE_ONLY = "; send it to a model whose engine serves /v1/messages itself"


def to_chat(payload: Any) -> dict[str, Any]:
    """The chat completions body that asks an engine what ``payload`` asks Anthropic."""
    payload = shapes.obj(payload, "body")
    chat: dict[str, Any] = {}
    if "model" in payload:
        chat["model"] = shapes.text(payload["model"], "model")
    if "max_tokens" not in payload:
        refuse("max_tokens", "`max_tokens` is required: the most tokens to generate.")
    chat["max_tokens"] = shapes.count(payload["max_tokens"], "max_tokens")
    messages = []
    if payload.get("system") is not None:
        messages.append({"role": "system", "content": _system(payload["system"])})
    turns = shapes.array(payload.get("messages"), "messages", empty=False)
    for i, turn in enumerate(turns):
        messages += _turn(turn, f"messages[{i}]")
    chat["messages"] = merge_turns(messages)
    if not chat["messages"] or chat["messages"][-1]["role"] == "system":
        refuse("messages", "`messages` holds nothing to answer (only thinking blocks).")
    last = chat["messages"][-1]
    if last["role"] == "assistant" and "tool_calls" not in last:
        chat.update(CONTINUE_FINAL_MESSAGE)  # a prefill: the answer goes on from it
    _sampling(payload, chat)
    _tools(payload, chat)
    _output_format(payload, chat)
    metadata = payload.get("metadata")
    if metadata is not None:
        user = shapes.obj(metadata, "metadata").get("user_id")
        if user is not None:
            chat["user"] = shapes.text(user, "metadata.user_id")
    if payload.get("stream") is not None and shapes.flag(payload["stream"], "stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    parts = []
    for i, block in enumerate(shapes.array(system, "system")):
        where = f"system[{i}]"
        block = shapes.obj(block, where)
        shapes.one_of(block.get("type"), f"{where}.type", ("text",))
        parts.append(shapes.text(block.get("text"), f"{where}.text"))
    return "\n\n".join(parts)


def _turn(turn: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool results become ``tool`` messages,
    before the rest of the turn, as chat wants them right after the calls."""
    turn = shapes.obj(turn, where)
    role = shapes.one_of(turn.get("role"), f"{where}.role", ("user", "assistant"))
    content = turn.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for i, block in enumerate(shapes.array(content, f"{where}.content", empty=False)):
        at = f"{where}.content[{i}]"
        block = shapes.obj(block, at)
        kind = shapes.one_of(block.get("type"), f"{at}.type", BLOCKS, NATIVE_ONLY + ".")
        if kind == "text":
            parts.append({"type": "text", "text": shapes.text(block.get("text"), f"{at}.text")})
        elif kind == "image":
            parts.append(_image(block.get("source"), f"{at}.source"))
        elif kind == "tool_use":
            _only(role, "assistant", kind, at)
            calls.append(_call(block, at))
        elif kind == "tool_result":
            _only(role, "user", kind, at)
            results.append(_result(block, at))
    messages = results
    if role == "assistant" and (parts or calls):
        if any(part["type"] != "text" for part in parts):
            refuse(f"{where}.content", f"`{where}.content`: an assistant turn holds no images.")
        message = {"role": role, "content": "".join(part["text"] for part in parts)}
        messages.append({**message, "tool_calls": calls} if calls else message)
    elif parts:
        single = len(parts) == 1 and parts[0]["type"] == "text"
        messages.append({"role": role, "content": parts[0]["text"] if single else parts})
    return messages


def _only(role: str, wanted: str, kind: str, where: str) -> None:
    if role != wanted:
        article = "an" if wanted == "assistant" else "a"
        refuse(f"{where}.type", f"`{where}.type` is {kind}, which belongs in {article} {wanted} "
               "turn.")  # fmt: skip


def _image(source: Any, where: str) -> dict[str, Any]:
    source = shapes.obj(source, where)
    kind = shapes.one_of(source.get("type"), f"{where}.type", ("base64", "url"),
                         " Files uploaded to Anthropic cannot reach this model.")  # fmt: skip
    if kind == "url":
        url = shapes.text(source.get("url"), f"{where}.url")
    else:
        media = shapes.text(source.get("media_type"), f"{where}.media_type")
        url = f"data:{media};base64,{shapes.text(source.get('data'), f'{where}.data')}"
    return {"type": "image_url", "image_url": {"url": url}}


def _call(block: dict[str, Any], where: str) -> dict[str, Any]:
    arguments = shapes.obj(block.get("input"), f"{where}.input")
    return {
        "id": shapes.text(block.get("id"), f"{where}.id"),
        "type": "function",
        "function": {
            "name": shapes.text(block.get("name"), f"{where}.name"),
            "arguments": json.dumps(arguments, ensure_ascii=False),
        },
    }


def _result(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = shapes.text(block.get("tool_use_id"), f"{where}.tool_use_id")
    content = block.get("content")
    if content is None or isinstance(content, str):
        return {"role": "tool", "tool_call_id": call_id, "content": content or ""}
    parts = []
    for i, item in enumerate(shapes.array(content, f"{where}.content")):
        at = f"{where}.content[{i}]"
        item = shapes.obj(item, at)
        kind = shapes.one_of(item.get("type"), f"{at}.type", ("text", "image"), NATIVE_ONLY + ".")
        if kind == "text":
            parts.append({"type": "text", "text": shapes.text(item.get("text"), f"{at}.text")})
        else:
            parts.append(_image(item.get("source"), f"{at}.source"))
    if all(part["type"] == "text" for part in parts):  # text alone: every engine takes a string
        return {"role": "tool", "tool_call_id": call_id,
                "content": "\n".join(part["text"] for part in parts)}  # fmt: skip
    return {"role": "tool", "tool_call_id": call_id, "content": parts}


def _sampling(payload: dict[str, Any], chat: dict[str, Any]) -> None:
    for name in ("temperature", "top_p"):
        if payload.get(name) is not None:
            chat[name] = shapes.number(payload[name], name)
    if payload.get("top_k") is not None:
        chat["top_k"] = shapes.count(payload["top_k"], "top_k", minimum=0)
    if payload.get("stop_sequences") is not None:
        stop = shapes.texts(payload["stop_sequences"], "stop_sequences")
        if stop:
            chat["stop"] = stop


def _tools(payload: dict[str, Any], chat: dict[str, Any]) -> None:
    tools = {}
    for i, tool in enumerate(shapes.array(payload.get("tools") or [], "tools")):
        where = f"tools[{i}]"
        tool = shapes.obj(tool, where)
        if tool.get("type") not in (None, "custom"):
            refuse(f"{where}.type", f"`{where}.type` {tool['type']!r} is a server tool of "
                   f"Anthropic's, which this model's engine cannot run{NATIVE_ONLY}.")  # fmt: skip
        name = shapes.text(tool.get("name"), f"{where}.name")
        function = {"name": name, "parameters": shapes.obj(tool.get("input_schema"),
                                                           f"{where}.input_schema")}  # fmt: skip
        if tool.get("description") is not None:
            function["description"] = shapes.text(tool["description"], f"{where}.description")
        tools[name] = {"type": "function", "function": function}
    choice = payload.get("tool_choice")
    if choice is not None:
        choice = shapes.obj(choice, "tool_choice")
        kind = shapes.one_of(choice.get("type"), "tool_choice.type", TOOL_CHOICES)
        if choice.get("disable_parallel_tool_use") is not None and shapes.flag(
            choice["disable_parallel_tool_use"], "tool_choice.disable_parallel_tool_use"
        ):
            chat["parallel_tool_calls"] = False
        if kind == "tool":
            # One named tool, said the way every engine understands: it alone, required.
            name = shapes.text(choice.get("name"), "tool_choice.name")
            if name not in tools:
                refuse("tool_choice.name", f"`tool_choice.name` {name!r} is not in `tools`.")
            tools = {name: tools[name]}
        if tools:
            chat["tool_choice"] = {"auto": "auto", "any": "required", "tool": "required",
                                   "none": "none"}[kind]  # fmt: skip
    if tools:
        chat["tools"] = list(tools.values())


def _output_format(payload: dict[str, Any], chat: dict[str, Any]) -> None:
    config = payload.get("output_config")
    if config is None or shapes.obj(config, "output_config").get("format") is None:
        return
    form = shapes.obj(config["format"], "output_config.format")
    shapes.one_of(form.get("type"), "output_config.format.type", ("json_schema",))
    schema = shapes.obj(form.get("schema"), "output_config.format.schema")
    chat["response_format"] = {"type": "json_schema",
                               "json_schema": {"name": "output", "schema": schema}}  # fmt: skip


# -- answers ----------------------------------------------------------------------------


def from_chat(answer: dict[str, Any], model: str) -> dict[str, Any]:
    """The Anthropic Message for an engine's chat completion."""
    choice = first_choice(answer)
    if not choice:
        raise errors.bad_gateway(f"The engine of {model} answered without a choice.")
    message = object_at(choice, "message")
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = tool_calls_of(message)
    for call_id, name, arguments in calls:
        content.append({"type": "tool_use", "id": call_id, "name": name,
                        "input": _tool_input(arguments)})  # fmt: skip
    finish = choice.get("finish_reason")
    reason, sequence = stop_reason(finish if isinstance(finish, str) else None, bool(calls),
                                   matched_stop(choice))  # fmt: skip
    tokens = tokens_of(answer.get("usage")) or Tokens()
    return {
        "id": new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_json(tokens.prompt, tokens.completion),
    }


def _tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as Anthropic's ``input`` object ({} when the model wrote
    something that is not a JSON object: the client's tool then says what is missing)."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


# -- errors -----------------------------------------------------------------------------


def error_body(status: int, body: bytes) -> bytes:
    """Any error answer (OpenAI's shape, an engine's own, plain text) in Anthropic's shape."""
    error = read_error_body(status, body)
    return json.dumps(error_json(status, error.message), ensure_ascii=False).encode()


def stream_translator(model: str) -> MessageEvents:
    """The engine's chat stream, told as ``model``'s Anthropic stream."""
    return MessageEvents(model)


def stream_error_event(message: str) -> bytes:
    """How a stream that already began ends on the router's own failure."""
    return error_event(EngineError(None, "api_error", None, message))
