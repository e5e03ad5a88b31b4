"""What the router and engines say to each other, under every room that talks to one:
``upstream`` (the router's one way out: a pool of HTTP/1.1 connections to engines),
``connection`` (one of those connections and the answer it carries) and ``tokens`` (the
usage engines report, read out of their answers and streams)."""
