"""uvicorn's HTTP/1.1 protocol with a deadline for a request's line and headers.

uvicorn closes a keep-alive connection idle after a response (``timeout_keep_alive``), but a client that
opens a connection and sends half a request line is held open for ever: enough of them use up the
server's sockets.  Here each connection must deliver a complete request head within ``seconds`` of
opening (or of its previous answer), or it is closed; the body's own deadline is the app's
(``Limits.read_timeout_s``).
"""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol


def with_head_deadline(seconds: float) -> type[H11Protocol]:
    """An ``H11Protocol`` subclass (uvicorn's ``http=``) closing connections slower than ``seconds``."""

    class HeadDeadline(H11Protocol):
        _deadline = None

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # the head arrived: the app reads the body under its own deadline

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

    return HeadDeadline
