"""The edge's defaults that the CLI shows in `--help`.

They live apart from the code that applies them so that `tokenfair serve --help` and
`tokenfair gateway --help` work on a base install, where FastAPI and uvicorn are absent.
"""

# The largest request body, by default, of the server and the gateway alike: a 128k-token
# prompt as token ids is about 1 MiB of JSON, a long chat several.
DEFAULT_MAX_BODY_BYTES = 4 << 20

# Seconds a client has to send a request's headers, and may pause inside its body
# (edge/read_timeout.py).
DEFAULT_READ_TIMEOUT_S = 30.0

# Seconds a client has, from the end of a request's headers, to send its whole body
# (edge/read_timeout.py): at 4 MiB, the largest body by default, about 70 KB/s.
DEFAULT_BODY_TIMEOUT_S = 60.0

# Bytes of events a stream may hold for a client that reads slower than its tokens come
# before it is cut (server/backlog.py): several times a long answer's whole stream
# (8,000 tokens stream as some 1.4 MB of events, about 170 bytes each), so only a client
# that has stopped keeping up meets it.
DEFAULT_MAX_STREAM_BUFFER_BYTES = 4 << 20
