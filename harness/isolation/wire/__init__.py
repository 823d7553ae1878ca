"""What the processes say to each other: the parent and a child (protocol: typed requests and
answers with ids), a client and a fork server (forkwire: strict JSON, shared limits and names).
"""
