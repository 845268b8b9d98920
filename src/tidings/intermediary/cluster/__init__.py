"""Many intermediaries sharing the load (claims 9, 11).

:mod:`.responsibility` cuts responsibility into slots (cells of the world, or buckets of
client ids) and :mod:`.directory` says who owns which slot and where it listens;
:mod:`.children` starts child processes and reads whether they started; :mod:`.peers` takes
a member in another process as the source of its cells' state, and :mod:`.areas` cuts each
member's upstream along the cells and composes views that span several members' cells;
:mod:`.member` is one member, which redirects requests it is not responsible for and hands
subscriptions over. :mod:`.membership` is the bookkeeping every cluster shares: its members,
and when one splits or merges; :mod:`.in_process` is a cluster whose members share one
process, stepped together; :mod:`.member_process` is one member in its own OS process, and
:mod:`.process_cluster` the supervisor that starts and stops such processes; :mod:`.tier` is
such a supervisor for a deployed tier: members on configured addresses, the dead replaced.
"""
