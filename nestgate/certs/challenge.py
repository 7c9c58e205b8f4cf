"""HTTP-01: answering the CA at `/.well-known/acme-challenge/{token}`.

Every site's route table (and the unclaimed Host's, and a redirect-to-HTTPS
listener's) answers this path before its own routes, access lists, sign-in and
rate limits: a private or redirecting site must still prove its name. The answer is
the key authorization the certificate process wrote to storage, so whichever worker
the CA reaches has it; a token not in storage is a plain 404.
"""

from __future__ import annotations

PREFIX = "/.well-known/acme-challenge/"
RAW_PREFIX = PREFIX.encode()
TEXT = [(b"content-type", b"application/octet-stream"), (b"cache-control", b"no-store")]


class ChallengeAnswer:
    is_async = True

    def __init__(self, storage) -> None:
        self.storage = storage

    async def handle(self, request) -> None:
        token = request.path[len(PREFIX):] if request.path.startswith(PREFIX) else ""
        answer = self.storage.http_answer(token)
        if answer is None:
            await request.send(404, [(b"content-type", b"text/plain; charset=utf-8")],
                               b"no such challenge\n")
        else:
            await request.send(200, TEXT, answer)
