"""``python -m dagq.observability.exporting SERVICE ACK_FD``: the helper process that
exports the spans of a dagq process (:mod:`dagq.observability.forwarding`).

It reads length-prefixed pickled messages from its stdin — ``("spans", [record, ...])``
and ``("flush",)`` — turns each record into an SDK span for a provider configured by
the ``OTEL_*`` environment (a BatchSpanProcessor and the OTLP exporter), answers a
flush with a byte on ``ACK_FD`` once everything is exported, and at the end of its
stdin exports what it has and exits.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Iterator
from typing import IO, Any

from dagq.observability import tracing

#: The batch processor's queue when ``OTEL_BSP_MAX_QUEUE_SIZE`` does not say: larger
#: than the SDK's 2,048, since spans arrive here by the batch, as fast as they are read.
QUEUE_SIZE = 16384


def _messages(stream: IO[bytes]) -> Iterator[tuple[Any, ...]]:
    while True:
        head = stream.read(4)
        if len(head) < 4:
            return
        body = stream.read(int.from_bytes(head, "big"))
        yield pickle.loads(body)  # from the process that started this one


def main(argv: list[str]) -> int:
    service, acks = argv[0], int(argv[1])
    queue_size = None if os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE") else QUEUE_SIZE
    provider = tracing.exporting_provider(service, max_queue_size=queue_size)
    finished = tracing.Finished(provider)
    for message in _messages(sys.stdin.buffer):
        if message[0] == "spans":
            for record in message[1]:
                finished.put(record)
        elif message[0] == "flush":
            provider.force_flush()
            os.write(acks, b".")
    provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
