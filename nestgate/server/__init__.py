"""The processes and their timing: the supervisor (listeners bound once, workers
forked and restarted, reload, drain, the side processes for certificates and the
CrowdSec bouncer), the worker (one uvloop loop per process, its connections and the
one tick that drives every timer), the start-up pieces (port holder, sd_notify, heap
trimming).
"""
