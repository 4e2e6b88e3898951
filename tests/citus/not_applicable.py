"""The tests that cannot apply to a Citus cluster, each with why: the one reviewed list.

Under ``PGMEMORY_TEST_CITUS`` (``make test-citus``) ``tests/conftest.py`` skips exactly these,
with their reason; every other test runs on the cluster. An entry names a test function
(``path::name``; every parametrisation of it). ``tests/citus/test_not_applicable.py`` checks
that each entry still names a real test.
"""

from __future__ import annotations

import pytest

_REAL_STANDBY = (
    "starts its own primary and streaming standby (one server and its replica, not a "
    "cluster): read replicas are tested by `make test`"
)
_EMBEDDED = (
    "the embedded server's own life cycle (it starts, shares, restarts and survives a crash of "
    "its own local server), which a cluster replaces"
)
_PARTITION = (
    "`pgmemory db partition` hash-partitions pgmemory_memories on one server; on Citus the "
    "table is distributed by user_id instead (partitioning a distributed table is not "
    "pgmemory's layout), so the command has nothing to do there"
)

#: ``{test id: why it cannot apply to a Citus cluster}``.
NOT_APPLICABLE: dict[str, str] = {
    "tests/reliability/test_erasure_races.py::test_the_guard_refuses_a_statement_whose_snapshot_an_erasure_outdated": (
        "calls the erasure guard of migration 0022 by itself; on Citus audited reads take the "
        "lock in a statement before them (locks are the coordinator's), so no statement "
        "calls the guard there"
    ),
    "tests/reliability/test_audit_functions.py::test_a_write_landing_inside_an_erasure_makes_it_fail_whole": (
        "simulates a write landing inside the erasure with a test trigger on pgmemory_chat_messages; "
        "Citus runs no trigger on a distributed table unless told to, and then on the shards, "
        "where the test's own function does not exist"
    ),
    "tests/store/test_two_phase.py::test_the_generic_plan_scans_the_first_pass_index_only_and_looks_up_the_shortlist": (
        "reads the plan of the statement on one server; on the coordinator EXPLAIN shows the "
        "distributed plan (one task to the user's shard) instead, and the same test asserts "
        "every read of the memories table names the user, which is what routes it there"
    ),
    "tests/store/test_fastpath.py::test_search_is_one_prepared_statement_that_writes_its_audit_row": (
        "on Citus a search's audit row is a statement of its own in the search's transaction "
        "(Citus would run the one-statement form in steps, with two-phase commit); "
        "tests/citus/test_recall_routed.py checks that both statements are routed"
    ),
    "tests/store/test_embedded.py::test_two_processes_share_one_server_and_it_stops": _EMBEDDED,
    "tests/reliability/test_server.py::test_closing_one_of_two_stores_leaves_the_server_to_the_other": _EMBEDDED,
    "tests/reliability/test_server.py::test_a_reopened_store_keeps_the_server_after_another_process_exits": _EMBEDDED,
    "tests/reliability/test_server.py::test_close_tolerates_a_killed_server": _EMBEDDED,
    "tests/reliability/test_server.py::test_a_store_restarts_a_killed_server": _EMBEDDED,
    "tests/reliability/test_server.py::test_the_pool_heals_after_a_restart": _EMBEDDED,
    "tests/reliability/test_server.py::test_many_processes_opening_and_closing_stores_never_lose_the_server": _EMBEDDED,
    "tests/reliability/test_server.py::test_a_store_survives_repeated_crashes_under_load": _EMBEDDED,
    "tests/store/test_replicas.py::test_recall_is_served_by_the_standby_and_audited_on_the_primary": (
        _REAL_STANDBY
    ),
    "tests/store/test_replicas.py::test_paused_replay_falls_back_to_the_primary_for_the_writer_only": (
        _REAL_STANDBY
    ),
    "tests/store/test_replicas.py::test_reads_fall_back_when_the_standby_dies_and_return_when_it_is_back": (
        _REAL_STANDBY
    ),
    "tests/admin/test_partitioning.py::test_partitioned_table_keeps_every_column_key_and_index": (
        _PARTITION
    ),
    "tests/admin/test_partitioning.py::test_partitioned_reads_and_writes_match_the_plain_table": (
        _PARTITION
    ),
    "tests/admin/test_partitioning.py::test_refused_when_not_empty_or_already_partitioned_or_bad_count": (
        _PARTITION
    ),
    "tests/admin/test_partitioning.py::test_enable_ann_on_a_partitioned_table_is_refused_clearly": (
        _PARTITION
    ),
    "tests/admin/test_partitioning.py::test_cli_partition_json_and_refusals": _PARTITION,
    "tests/package/test_statements_at_wire.py::test_one_server": (
        "compares what pgmemory sends to one server with that deployment's golden files; on the "
        "cluster the same script is checked against tests/golden/statements-citus.txt "
        "(test_citus)"
    ),
    "tests/package/test_statements_at_wire.py::test_read_replicas": _REAL_STANDBY,
    "tests/store/test_routing.py::test_distribute_without_citus_says_so_and_changes_nothing": (
        "checks the refusal when the citus extension is missing, and every database on the "
        "cluster has it; tests/admin/test_distribute.py tests distribute on the cluster"
    ),
    **dict.fromkeys(
        (
            f"tests/reliability/test_driver_errors.py::{name}"
            for name in (
                "test_a_write_killed_before_its_commit_is_not_stored_and_its_retry_stores_it_once",
                "test_a_write_killed_during_its_commit_has_an_unknown_outcome_and_a_safe_retry",
                "test_an_agent_turn_whose_connection_dies_mid_write_raises_the_pgmemory_error",
                "test_a_statement_timeout_names_the_setting",
            )
        ),
        "stops the write's backend at a chosen point with a test trigger on "
        "pgmemory_chat_messages; Citus runs no trigger on a distributed table unless told to, "
        "and then on the shards, where the write's backend is a worker's connection (the "
        "file's other tests, the lost reply after the commit among them, are not skipped)",
    ),
}


def skip_not_applicable(items: list[pytest.Item]) -> None:
    """Mark the collected tests of :data:`NOT_APPLICABLE` to be skipped, with their reason."""
    for item in items:
        reason = NOT_APPLICABLE.get(item.nodeid.split("[", 1)[0])
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"not applicable on Citus: {reason}"))
