"""intake: validates submits (stream and request-reply) and turns them into job events.

``app`` is the composition root (broker, subscribers, settings), ``handlers`` the decode ->
validate -> claim -> publish steps, ``registry`` the KV bucket of idempotency records.
"""
