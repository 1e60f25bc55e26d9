"""Skill library records, mirroring the engine's documents: skill cards (intent, anchor,
preconditions, effects, risks, scope, requires/provides/conflicts), their admission roundtrips
and the trials that apply them to new problems. None yet."""
