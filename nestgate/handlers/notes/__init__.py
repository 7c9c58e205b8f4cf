"""Markdown notes: files on disk (store), their rendered pages (pages), their JSON API (api).

The notes directory is the only state: every worker reads it, any worker may write it,
and a generation counter shared through a memory-mapped file tells every worker, on
its next request, that its rendered pages are stale (DESIGN.md: processes and state).
"""
