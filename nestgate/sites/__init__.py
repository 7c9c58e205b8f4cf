"""A config's sites compiled into the router a worker answers from: `build` (the
routes of every site, the pages, the ACME challenge slot), `routetypes` (one reader
and builder per route type), `guard` (a site's rate limits, network rules, sign-in,
forward auth and ban watch, compiled once and handed to its route table).
"""
