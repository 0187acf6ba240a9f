"""The token stream part of the Store conformance suite (mixed into
:class:`~mainspring.testing.conformance.StoreConformance`): appends are fenced by the
run's epoch as journal commits are, and a reader paging by the cursor never steps over
a row, however the appends of several writers interleave."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ..storage import RunTransition, RunWrite, Store, TokenChunk, TokenPiece

__all__ = ["StreamConformance"]

T0 = 1_000_000.0
LEASE = 15.0


def _text(s: Store, run_id: str, epoch: int, seq: int, idx: int, text: str, **kw: Any) -> bool:
    return s.append_tokens(
        run_id,
        epoch=epoch,
        session=0,
        seq=seq,
        attempt=kw.pop("attempt", 1),
        idx=idx,
        pieces=[TokenPiece(text=text)] if text else [],
        now=kw.pop("now", T0),
        **kw,
    )


class StreamConformance:
    """Live token streams: fenced appends, commit-ordered places, pruning."""

    if TYPE_CHECKING:  # what StoreConformance provides

        def store(self) -> AbstractContextManager[Store]: ...

        def reopen(self) -> Store: ...

        def _claim(self, s: Store, now: float = T0, **kw: Any) -> list[Any]: ...

        def _new(self, s: Store, run_id: str, key: str | None = None, now: float = T0) -> None: ...

    def _running(self, s: Store, run_id: str, now: float = T0) -> int:
        """A new run, claimed: its epoch."""
        self._new(s, run_id, now=now)
        [run] = self._claim(s, now=now, run_id=run_id)
        return int(run.epoch)

    def test_token_streams_append_read_in_order_and_go_with_their_run(self) -> None:
        with self.store() as s:
            a, b = self._running(s, "a"), self._running(s, "b")
            assert _text(s, "a", a, 1, 0, "Hel")
            assert _text(s, "b", b, 0, 0, "other")
            call = TokenPiece(text='{"ci', kind="tool_call", call_index=0, call_id="c1", name="f")
            assert s.append_tokens(
                "a",
                epoch=a,
                session=0,
                seq=1,
                attempt=1,
                idx=1,
                pieces=[TokenPiece(text="lo"), call],
                now=T0 + 5,
                end="done",
            )
            rows = s.tokens_after("a")
            assert [
                (r.session, r.seq, r.epoch, r.attempt, r.idx, r.kind, r.text, r.end) for r in rows
            ] == [
                (0, 1, a, 1, 0, "text", "Hel", None),
                (0, 1, a, 1, 1, "text", "lo", None),
                (0, 1, a, 1, 2, "tool_call", '{"ci', "done"),  # the end rides the last row
            ]
            assert (rows[2].call_index, rows[2].call_id, rows[2].name) == (0, "c1", "f")
            assert [r.pos for r in rows] == [1, 2, 3]  # the run's own places, from 1
            # A second process sees the rows at once, and pages after a place.
            other = self.reopen()
            try:
                assert [r.text for r in other.tokens_after("a", rows[0].pos)] == ["lo", '{"ci']
            finally:
                other.close()
            # What a reader resuming after a place has seen.
            [seen] = s.token_streams("a", rows[0].pos)
            assert (seen.seq, seen.epoch, seen.attempt, seen.end) == (1, a, 1, None)
            assert [x.end for x in s.token_streams("a", rows[2].pos)] == ["done"]
            # An unknown end, and an append with nothing to append, are refused.
            bad: list[dict[str, Any]] = [{"end": "finished"}, {}]
            for kw, words in zip(bad, ("'finished'", "pieces or an end"), strict=True):
                said = ""
                try:
                    s.append_tokens(
                        "a", epoch=a, session=0, seq=2, attempt=1, idx=0, pieces=[], now=T0, **kw
                    )
                except ValueError as exc:
                    said = str(exc)
                assert words in said, f"append_tokens(..., {kw}) said {said!r}"
            assert s.prune_tokens(T0 + 1) == 2  # by age: "Hel" and "other"
            assert [r.text for r in s.tokens_after("a")] == ["lo", '{"ci']
            # Places keep counting up after a prune: a reader's cursor stays valid.
            assert _text(s, "a", a, 2, 0, "next")
            assert [r.pos for r in s.tokens_after("a", rows[2].pos)] == [4]
            done = RunTransition(kind="finish", status="succeeded", output="1")
            assert s.commit([RunWrite(run_id="a", epoch=a, transition=done)], T0)[0].ok
            s.prune(0, T0 + 10)  # with their run
            assert s.tokens_after("a") == [] and s.get_run("a") is None

    def test_a_token_append_at_a_stale_epoch_is_refused(self) -> None:
        with self.store() as s:
            self._new(s, "r")
            assert not _text(s, "r", 0, 0, 0, "queued")  # not running yet
            [first] = self._claim(s, run_id="r")
            assert _text(s, "r", first.epoch, 0, 0, "The qu")
            # The lease runs out; another worker takes the run over.
            [second] = self._claim(s, now=T0 + LEASE + 1, worker="w2", run_id="r")
            assert second.epoch > first.epoch
            # The first worker, back from a freeze, goes on writing: refused, nothing
            # written, and the new owner's stream is not disturbed.
            assert not _text(s, "r", first.epoch, 0, 1, "ick brown fox", end="done")
            assert _text(s, "r", second.epoch, 0, 0, "The quick", attempt=2)
            rows = s.tokens_after("r")
            assert [(r.epoch, r.text) for r in rows] == [
                (first.epoch, "The qu"),
                (second.epoch, "The quick"),
            ]
            # A finished run takes no more rows at any epoch.
            done = RunTransition(kind="finish", status="succeeded", output="1")
            assert s.commit([RunWrite(run_id="r", epoch=second.epoch, transition=done)], T0)[0].ok
            for epoch in (second.epoch, second.epoch + 1):
                assert not _text(s, "r", epoch, 0, 1, "late", attempt=2, end="done")
            assert len(s.tokens_after("r")) == 2

    def test_a_token_cursor_never_steps_over_a_row_of_concurrent_writers(self) -> None:
        """Two writers (two model calls of one run at once, as under asyncio.gather)
        append to one run while a reader pages by the cursor as fast as it can: it
        reads every row exactly once, in place order, each writer's rows in its own
        order. (On PostgreSQL, paging by ``id`` can lose rows here.)"""
        per_writer = 60
        with self.store() as s:
            epoch = self._running(s, "r")
            writers = [self.reopen(), self.reopen()]
            reader = self.reopen()
            read: list[TokenChunk] = []
            done = threading.Event()
            failed: list[BaseException] = []

            threads = [
                threading.Thread(target=_write_tokens, args=(w, epoch, n, per_writer, failed))
                for n, w in enumerate(writers)
            ]
            follower = threading.Thread(target=_follow_tokens, args=(reader, done, read, failed))
            try:
                follower.start()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(60)
                done.set()
                follower.join(60)
            finally:
                for store in (*writers, reader):
                    store.close()
            assert not failed, failed
            assert [r.pos for r in read] == list(range(1, 2 * per_writer + 1))
            for seq in (0, 1):
                assert [r.idx for r in read if r.seq == seq] == list(range(per_writer))


def _write_tokens(
    store: Store, epoch: int, seq: int, count: int, failed: list[BaseException]
) -> None:
    """One writer of the concurrent-writers test: ``count`` rows of step ``seq``
    (a failure is kept in ``failed``, for the test to report)."""
    try:
        for i in range(count):
            assert _text(store, "r", epoch, seq, i, f"{seq}:{i} ")
    except BaseException as exc:  # reported by the test
        failed.append(exc)


def _follow_tokens(
    reader: Store, done: threading.Event, read: list[TokenChunk], failed: list[BaseException]
) -> None:
    """The reader of the concurrent-writers test: pages by the cursor as fast as it
    can into ``read`` until ``done`` is set and a read after it finds nothing."""
    cursor = 0
    try:
        while True:
            finished = done.is_set()  # before the read: it sees every commit
            rows = reader.tokens_after("r", cursor)
            read.extend(rows)
            cursor = rows[-1].pos if rows else cursor
            if finished and not rows:
                return
    except BaseException as exc:
        failed.append(exc)
