"""The operator side: a listener of its own (`[admin]`, 127.0.0.1:7998 by default)
served by a process of its own, never by the workers, so a site cannot reach it and a
request on it never reaches a site.

    config.py    the `[admin]` table and the NESTGATE_ADMIN / NESTGATE_ADMIN_TOKEN overrides
    stats.py     the table each worker writes its figures into, once a tick
    api.py       the endpoints and the token gate in front of them
    process.py   the admin process: the supervisor's reports in, the listener out
"""
