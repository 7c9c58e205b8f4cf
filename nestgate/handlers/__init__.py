"""Route handlers. A handler is either synchronous (`is_async = False`: `current()`
returns a `Prebuilt` response, written from the parser callback) or asynchronous
(`is_async = True`: `handle(request)` is a coroutine that answers through the request)."""
