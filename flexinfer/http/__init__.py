"""flexinfer.http: the raw HTTP/1.1 core shared by the proxy, the extender, the agent's metrics port
and the local runtime's admin pages. It knows no models.

Modules (see ``docs/http-core-contract.md`` for the interface):

- ``server.py``: listener, uvloop, signals, graceful drain, SO_REUSEPORT workers, the 1 Hz tick
  (cached Date header, connection deadlines).
- ``protocol.py``: one object per connection on httptools; limits checked as bytes arrive,
  deadlines, keep-alive, pipelining, Expect: 100-continue, and the ONE place where a bad request
  becomes an error response. ``Handler``, ``ClientGone``; re-exports ``Request``, ``ResponseWriter``.
- ``head.py``: the request-head rules (request line, the header loop, Host/CL/TE/Upgrade/Expect,
  body framing) as pure functions; ``Rejected``.
- ``closing.py``: how a connection ends: rejections, graceful close and linger, abort, deadlines
  (``Closing``, the base of ``HttpProtocol``).
- ``request.py``: ``Request`` and ``ResponseWriter``, the per-request objects, and ``Connection``,
  what a writer uses of its connection.
- ``flow.py``: backpressure both ways (pause/resume reading, drain writing).
- ``responses.py``: status lines, header bytes, OpenAI error bodies, SSE framing, made ahead.
- ``client.py``: upstream keep-alive pools, one exchange per connection, strict response parsing and
  timeouts; re-exports the names of ``upstream.py``.
- ``upstream.py``: upstream error types, canonical request serialization, ``UpstreamResponse`` and
  ``relay()``; knows its connection only as a ``BodySource`` (client.py imports it, never back).

Nothing is imported here, so importing one module does not pull in the others.
"""
