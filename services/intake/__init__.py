"""intake: validates submits (stream and request-reply) and turns them into job events.

``app`` is the service (its connections, entrances and settings), ``__main__`` its composition
on the service runtime, ``handlers`` the decode -> validate -> claim -> publish steps,
``registry`` the claims of request ids in the jobs stream (docs/intake.md).
"""
