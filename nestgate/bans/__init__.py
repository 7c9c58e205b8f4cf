"""Bans: clients refused at accept for what they did (fail2ban's idea, in the server).

    table    the shared-memory table every process looks clients up in (at accept)
    config   `[[ban]]` rules and `[bans]`
    store    bans kept in the state store (SQLite or Redis): they survive a restart and
             are shared by instances
    watch    a worker's side: counting what clients do, banning, keeping its table in
             step with the store, refusing at accept, the 403 page
    cli      `nestgate ban list | add | remove`
    crowdsec        the CrowdSec bouncer: a side process polls the Local API's
                    decisions into the ban table; decisions: kept in a file for restarts
    crowdsecalerts  nestgate's own bans sent to the Local API as alerts
"""
