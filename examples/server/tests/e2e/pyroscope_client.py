"""A real Python program profiled by the real pyroscope-io client, pushing to frostdb.

Usage: pyroscope_client.py SERVER_URL TENANT SECONDS
Burns CPU in frostdb_e2e_busy_loop (and its callee frostdb_e2e_hash) for SECONDS, then shuts
the agent down, which uploads what it has.
"""
import hashlib
import sys
import time

import pyroscope


def frostdb_e2e_hash(data: bytes) -> bytes:
    for _ in range(200):
        data = hashlib.sha256(data).digest()
    return data


def frostdb_e2e_busy_loop(seconds: float) -> int:
    end = time.monotonic() + seconds
    n, data = 0, b"frostdb"
    while time.monotonic() < end:
        data = frostdb_e2e_hash(data)
        n += 1
    return n


def main() -> None:
    url, tenant, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    pyroscope.configure(
        application_name="frostdb-e2e-python",
        server_address=url,
        tags={"env": "e2e"},
        tenant_id=tenant,
        upload_interval=1,
        enable_logging=True,
    )
    n = frostdb_e2e_busy_loop(seconds)
    ok = pyroscope.shutdown()
    print(f"iterations={n} shutdown={ok}", flush=True)


if __name__ == "__main__":
    main()
