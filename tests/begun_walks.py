"""GPU walks begun on the H200 and cut by their calls' time limits, to be resumed: how many steps
of each the recorded verdicts hold (tests/test_replay_walks.py replays them; a resumed walk
warms only the states past them, tests/test_walk_prefetch.py). Update when a walk goes on; drop
it when it ends and its lineage is committed."""

BEGUN = {"fmha/flash_wgmma": 13}
