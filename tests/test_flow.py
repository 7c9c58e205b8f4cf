"""`nestgate.base.flow.Writable`, the wait behind every backpressure pause."""

from __future__ import annotations

import asyncio

import pytest

from nestgate.base.flow import Writable


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5))


def test_every_waiter_wakes_and_a_cancelled_one_leaves_the_others():
    async def main():
        writable = Writable()
        woken = []

        async def waiter(name):
            await writable.wait()
            woken.append(name)

        tasks = [asyncio.create_task(waiter(n)) for n in ("a", "b", "c")]
        await asyncio.sleep(0)
        tasks[1].cancel()
        await asyncio.sleep(0)
        assert woken == []
        writable.wake()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert sorted(woken) == ["a", "c"] and tasks[1].cancelled()
        # A later pause needs a new wake: the last one is not remembered.
        late = asyncio.create_task(waiter("d"))
        await asyncio.sleep(0.01)
        assert not late.done()
        writable.wake()
        await late
    _run(main())


def test_close_wakes_every_waiter_with_the_error_and_later_waits_at_once():
    async def main():
        writable = Writable()
        tasks = [asyncio.create_task(writable.wait()) for _ in range(3)]
        await asyncio.sleep(0)
        writable.close(ConnectionResetError("client went away"))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, ConnectionResetError) for r in results)
        with pytest.raises(ConnectionResetError):
            await writable.wait()
    _run(main())


def test_close_without_an_error_just_ends_the_waits():
    async def main():
        writable = Writable()
        task = asyncio.create_task(writable.wait())
        await asyncio.sleep(0)
        writable.close()
        await task
        await writable.wait()                 # closed: returns at once
        assert writable.closed
    _run(main())
