"""Running totals of KV pages one worker moved through its connector, for ``/ascend-kernel/report``.

vLLM's connector stats are drained every step into the scheduler's logging
(``get_kv_connector_stats`` returns what happened since its last call), so a
report asked for at any later time cannot read them; these totals only grow.
Written from the connector's sender threads and receiver loop, read by the
worker's report RPC, hence the lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class TransferCounts:
    """Blocks and bytes this worker sent (producer) and received (consumer), plus failed transfers."""

    #: bytes of one block over every registered region (all layers' pages of one block id)
    bytes_per_block: int = 0
    bytes_sent: int = 0
    blocks_received: int = 0
    requests_sent: int = 0
    requests_received: int = 0
    failed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def sent(self, num_bytes: int) -> None:
        with self._lock:
            self.bytes_sent += num_bytes
            self.requests_sent += 1

    def received(self, blocks: int) -> None:
        with self._lock:
            self.blocks_received += blocks
            self.requests_received += 1

    def failure(self) -> None:
        with self._lock:
            self.failed += 1

    def as_dict(self) -> dict[str, Any]:
        """The report's ``kv_transfer`` counters.

        Blocks sent are derived from bytes: the producer pushes whole pages of
        every registered region per block (equal TP sizes), so a block costs
        ``bytes_per_block``. Bytes received are blocks times that size.
        """
        with self._lock:
            per_block = self.bytes_per_block
            blocks_sent = self.bytes_sent // per_block if per_block else 0
            bytes_received = self.blocks_received * per_block
            return {
                "kv_blocks_sent": blocks_sent,
                "kv_blocks_received": self.blocks_received,
                "kv_bytes_sent": self.bytes_sent,
                "kv_bytes_received": bytes_received,
                "kv_bytes_transferred": self.bytes_sent + bytes_received,
                "kv_requests_sent": self.requests_sent,
                "kv_requests_received": self.requests_received,
                "kv_failed_transfers": self.failed,
                "kv_bytes_per_block": per_block,
            }
