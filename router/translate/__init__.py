"""Serving Anthropic's Messages API and OpenAI's Responses API on an engine's chat completions.

Pure translation, no I/O: the router decides when an engine lacks an endpoint and calls
these on the way in (a client's body to a chat completions body) and on the way out (the
engine's answer, whole or streamed, to the client's API; its errors likewise).

- ``messages``: Anthropic ``/v1/messages`` requests, answers and errors.
- ``message_events``: the chat stream as Anthropic's ``message_start``/``content_block_*``/…
- ``responses``: OpenAI ``/v1/responses`` requests, answers and errors.
- ``response_events``: the chat stream as the Responses API's ``response.*`` events.
- ``chat``: what both share: reading the engine's answers, streamed chunks and errors.
- ``shapes``: reading a client's body, each wrong shape a 400 that names its field.
"""
