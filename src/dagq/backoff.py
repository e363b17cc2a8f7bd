"""Delays between attempts: exponential backoff with deterministic jitter.

The jitter is drawn from a hash of the attempt's id rather than a random generator,
so the state machine stays a pure function and a replay computes the same delay.
"""

from __future__ import annotations

import hashlib

from dagq.definition import RetryPolicy


def retry_delay(policy: RetryPolicy, failed_attempt: int, key: str) -> float:
    """Seconds to wait before the attempt after ``failed_attempt`` (1-based).

    ``backoff_s * backoff_multiplier ** (failed_attempt - 1)``, capped at
    ``backoff_max_s``, then spread by ``±jitter`` of itself.
    """
    base = policy.backoff_s * policy.backoff_multiplier ** max(failed_attempt - 1, 0)
    base = min(base, policy.backoff_max_s)
    if policy.jitter <= 0 or base <= 0:
        return base
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    unit = int.from_bytes(digest, "big") / 2**64  # uniform in [0, 1)
    return max(0.0, base * (1 + policy.jitter * (2 * unit - 1)))
