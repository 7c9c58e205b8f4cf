"""What every layer shares and that imports nothing above it: the handler contract,
ready responses and error pages, compression, the tally and the clock, errors, the
grammar, units and paths, client addresses and host names, the route record, flow
control and send timeouts.
"""
