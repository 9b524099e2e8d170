"""The pure decisions, the same on every store: a job's transitions and fencing, gates,
governance, preemption, fleet-wide limits, resources, claim policy and aging, results'
schemas, a workflow's views, a waiting job's explanation, names, times and values.
No I/O, no SQL, no clock reads. May import wire and the base modules only (the layers
contract); every other package may import it.
"""
