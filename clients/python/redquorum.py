"""A small client of `redquorum serve`, standard library only (Python 3.8+).

    import redquorum
    rq = redquorum.Client("http://127.0.0.1:7380")          # token="..." if the server has one
    ids = rq.next_ids("orders", count=3)                    # [101, 102, 103]

    with rq.lock("nightly-report", ttl="10s", wait="30s") as lease:
        write_report(fencing_token=lease.token)             # pass the token with every write
        if lease.lost.is_set():                             # advice: the token is the guarantee
            ...

    run = rq.begin_period("nightly", "2026-11-27", wait="1m")
    if run.due:
        do_the_work(fencing_token=run.token)
        run.complete()                                      # recorded; other callers get `done`

A lease (or a period's run) is a session of the server: it lives while its stream is open.
Closing the stream (leaving the `with` block, `release()`, or this process dying) ends it
and the server releases the lease at once. Across the process boundary a loss reaches this
process only as fast as the stream carries it: `lost` is advice, and the fencing token at
the resource is what keeps it safe.
"""

import collections
import http.client
import json
import socket
import ssl
import threading
import urllib.parse

__all__ = ["Client", "Lease", "PeriodRun", "Error"]


class Error(Exception):
    """An error answer: `status`, `code` (e.g. "held", "invalid", "no_quorum") and `field`."""

    def __init__(self, status, body):
        error = (body or {}).get("error", {}) if isinstance(body, dict) else {}
        self.status = status
        self.code = error.get("code", "http_%d" % status)
        self.field = error.get("field")
        self.message = error.get("message", str(body))
        super().__init__("%s (%s%s): %s" % (
            status, self.code, ", field " + self.field if self.field else "", self.message))


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (`serve --listen unix:PATH`)."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class Client:
    """The server at `base_url`: http://HOST:PORT, https://HOST:PORT (`cafile`: the CA that
    signed the server's certificate, else the system's) or unix:PATH."""

    def __init__(self, base_url, token=None, timeout=60.0, cafile=None):
        if base_url.startswith("unix:"):
            self._scheme, self._socket = "unix", base_url[len("unix:"):]
        else:
            url = urllib.parse.urlsplit(base_url)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError("base_url must be http://HOST:PORT, https://HOST:PORT or unix:PATH, got %r" % base_url)
            self._scheme, self._host, self._port = url.scheme, url.hostname, url.port
        self._context = ssl.create_default_context(cafile=cafile) if self._scheme == "https" else None
        self._token, self._timeout = token, timeout

    # -- plumbing ---------------------------------------------------------------------------

    def _connection(self, timeout=None):
        timeout = timeout or self._timeout
        if self._scheme == "unix":
            return _UnixConnection(self._socket, timeout)
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._context)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _headers(self):
        headers = {"Accept": "application/json, application/x-ndjson"}
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        return headers

    @staticmethod
    def _path(template, *names, **query):
        path = template.format(*[urllib.parse.quote(n, safe="") for n in names])
        query = {k: v for k, v in query.items() if v is not None}
        return path + ("?" + urllib.parse.urlencode(query) if query else "")

    def _call(self, method, path):
        conn = self._connection()
        try:
            conn.request(method, path, headers=self._headers())
            response = conn.getresponse()
            body = response.read()
            value = json.loads(body) if body else None
            if response.status != 200:
                raise Error(response.status, value)
            return value
        finally:
            conn.close()

    def _open_stream(self, path):
        """POST `path` and return (connection, response, first event) of its NDJSON stream."""
        conn = self._connection(timeout=None)
        conn.request("POST", path, headers=self._headers())
        response = conn.getresponse()
        if response.status != 200:
            body = response.read()
            conn.close()
            raise Error(response.status, json.loads(body) if body else None)
        line = response.readline()
        if not line:
            conn.close()
            raise Error(502, {"error": {"code": "stream_ended", "message": "the stream ended before its first event"}})
        return conn, response, json.loads(line)

    # -- the API ----------------------------------------------------------------------------

    def next_ids(self, sequence, count=1):
        """`count` new fencing IDs of `sequence`, consecutive, above every ID returned before."""
        return self._call("POST", self._path("/v1/ids/{}", sequence, count=count))["ids"]

    def next_id(self, sequence):
        return self.next_ids(sequence, 1)[0]

    def lock(self, name, ttl="10s", wait="0s", holder=None):
        """Acquire the lease on `name` (raises Error with code "held" or "timeout" if not)."""
        path = self._path("/v1/locks/{}/acquire", name, ttl=ttl, wait=wait, holder=holder)
        return Lease(self, *self._open_stream(path))

    def campaign(self, election, candidate, ttl="10s", wait="0s"):
        """Become the leader of `election`; a Lease whose `token` is the term."""
        path = self._path("/v1/elections/{}/campaign", election, candidate=candidate, ttl=ttl, wait=wait)
        return Lease(self, *self._open_stream(path))

    def leader(self, election):
        """The current leader (dict with candidate, term) or None."""
        return self._call("GET", self._path("/v1/elections/{}/leader", election))["leader"]

    def holder(self, name):
        """Who holds the lock (dict with holder, token) or None."""
        return self._call("GET", self._path("/v1/locks/{}/holder", name))["holder"]

    def begin_period(self, job, period, ttl="10s", wait="0s"):
        """Begin `period` of `job`: a PeriodRun that is `due` (do the work, then `complete()`)
        or done already (`due` False, `token` of the run that did it). Raises Error "held" when
        another caller holds the job and `wait` ran out."""
        path = self._path("/v1/jobs/{}/periods/{}/begin", job, period, ttl=ttl, wait=wait)
        conn, response, first = self._open_stream(path)
        if first["event"] == "done":
            conn.close()
            return PeriodRun(self, None, None, first)
        return PeriodRun(self, conn, response, first)

    def health(self):
        """The server's health report (raises Error 503 when not healthy)."""
        return self._call("GET", "/v1/health")


class Lease:
    """A held lease (or leadership): `token`, `session`, `lost` (a threading.Event set when the
    server reports the lease lost or the stream ends), `events` (the last 100 events seen)."""

    def __init__(self, client, conn, response, first):
        self._client, self._conn, self._response = client, conn, response
        self.session = first["session"]
        self.token = first.get("token", first.get("term"))
        self.first = first
        self.events = collections.deque([first], maxlen=100)
        self.lost = threading.Event()
        self._ended = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        try:
            while True:
                line = self._response.readline()
                if not line:
                    break
                event = json.loads(line)
                self.events.append(event)
                if event.get("event") in ("lost", "released", "resigned", "abandoned", "completed"):
                    break
        except (OSError, ValueError, http.client.HTTPException):
            pass
        finally:
            self.lost.set()
            self._ended.set()

    def _finish(self, action):
        try:
            return self._client._call("POST", "/v1/sessions/%s/%s" % (self.session, action))
        finally:
            self._ended.wait(5)
            self._conn.close()

    def release(self):
        """Release the lease (resign); returns the server's final event."""
        if self._ended.is_set():
            self._conn.close()
            return None
        return self._finish("release")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.release()
        except Error:
            pass  # the session ended already: the server released the lease


class PeriodRun(Lease):
    """A period's run: `due` (do the work, then `complete()` or `abandon()`), or done already
    (`due` False; `token` is the token of the run that did it)."""

    def __init__(self, client, conn, response, first):
        self.due = first["event"] == "begun"
        if not self.due:
            self.session, self.token, self.first, self.events = None, first["token"], first, [first]
            self.lost, self._ended = threading.Event(), threading.Event()
            self._ended.set()
            return
        super().__init__(client, conn, response, first)

    def complete(self):
        """Record the period as done with this run's token (then the lease is released).

        The record counts only while the job's lease holds: Error with code "lease_lost"
        (409) when it was lost before the record counted (nothing counts as recorded), and
        "no_quorum" (503) when no majority decided either way."""
        return self._finish("complete")

    def abandon(self):
        """Record nothing and release the lease: the next caller runs the period."""
        return self.release()
