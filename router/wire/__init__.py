"""The bytes on the router's sockets, under every room that talks to a client or an engine:
``upstream`` (the router's one way out: a pool of HTTP/1.1 connections to engines),
``connection`` (one of those connections and the answer it carries), ``tokens`` (the
usage engines report, read out of their answers and streams), ``server`` (the way in:
the router's own HTTP/1.1 server) and ``serving`` (that server on a socket until a
signal)."""
