"""Shards written off the engine's step: the step copies a request's blocks to the host and hands
them to a background thread, which writes the shard file. The queue is bounded; when it is full
the request is skipped, counted, and a marker file says so, so that serving never waits for the
disk for longer than one copy."""

import atexit
import logging
import os
import queue
import threading

from ..shards import skipped_marker_path, write_shard

log = logging.getLogger("kvscope_capture")


class ShardQueue:
    """max_pending: requests copied and not yet written, at most (each holds its blocks in host memory)."""

    def __init__(self, max_pending=8):
        if int(max_pending) < 1:
            raise ValueError(f"KvscopeConnector: max_pending_requests {max_pending} must be at least 1")
        self._queue = queue.Queue(int(max_pending))
        self._write = write_shard
        self.skipped = 0
        self.failed = {}  # shard path -> why it could not be written
        self._thread = threading.Thread(target=self._run, name="kvscope-shard-writer", daemon=True)
        self._thread.start()
        atexit.register(self.flush, 120.0)

    def has_room(self):
        return not self._queue.full()

    def submit(self, path, *shard):
        """Queues a shard (write_shard's arguments after the path); False when the queue is full."""
        try:
            self._queue.put_nowait((path, shard))
            return True
        except queue.Full:
            return False

    def skip(self, path, request_id, why):
        """Counts a request left out and leaves its marker beside the shards."""
        self.skipped += 1
        self._mark(path, request_id, why)

    @staticmethod
    def _mark(path, request_id, why):
        """The marker a request leaves instead of its shard: the bundle step names it as left out."""
        log.warning("kvscope: request %s not captured: %s", request_id, why)
        try:
            with open(skipped_marker_path(path), "w") as f:
                f.write(f"{request_id}: {why}\n")
        except OSError as e:
            log.warning("kvscope: %s", e)

    def flush(self, timeout=None):
        """Waits until every queued shard is written (or `timeout` seconds); True when done."""
        done = threading.Event()
        threading.Thread(target=lambda: (self._queue.join(), done.set()), daemon=True).start()
        return done.wait(timeout)

    def _run(self):
        while True:
            path, shard = self._queue.get()
            try:
                self._write(path, *shard)
            except Exception as e:  # a full disk must not stop serving: the request goes missing, named
                self.failed[path] = str(e)
                try:
                    os.remove(path + ".partial")
                except OSError:
                    pass
                self._mark(path, shard[0].request_id, f"its shard could not be written ({e})")
            finally:
                self._queue.task_done()
