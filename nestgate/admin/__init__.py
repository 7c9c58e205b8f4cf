"""The operator side: a listener of its own (`[admin]`, 127.0.0.1:7998 by default)
served by a process of its own, never by the workers, so a site cannot reach it and a
request on it never reaches a site.

    config.py    the `[admin]` table and the NESTGATE_ADMIN / NESTGATE_ADMIN_TOKEN overrides
    token.py     the token nestgate makes at its first start when none is configured
    stats.py     the table each worker writes its figures into, once a tick
    origin.py    the Host, Origin, Sec-Fetch-Site and Content-Type checks before the token
    guessing.py  wrong tokens: counted per client and over all, their answers paced
    api.py       the endpoints and the token gate in front of them
    process.py   the admin process: the supervisor's reports in, the listener out
"""
