"""``echomq_flow_check``: a fan-out asset's failed and ignored children as an asset check.

Using::

    @asset(io_manager_key="echomq_io")
    def scores(context, echomq: EchoMQResource) -> FlowRef:
        return echomq.add_flow("scores", [...], parent_id=echomq.run_scoped_id(context))

    scores_children = echomq_flow_check(scores, warn_above=0.0, fail_above=0.05)
    defs = Definitions(assets=[scores], asset_checks=[scores_children], resources=...)

The check reads the flow the asset's last materialization stored (its handle, as the IO
manager reads it; a check run on its own judges that one), waits until it settles (pumping
its children's queues, as an input does), and judges the share of its N children that failed
or whose failure was ignored: at most ``warn_above`` passes; above it the check fails with
severity WARN, and above ``fail_above`` (when given) with severity ERROR. A flow that failed or
was cancelled as a whole fails it with ERROR whatever the thresholds, and so does a handle
whose flow the server no longer holds (expired); a wait that times out or stalls fails the
check's step (``FlowTimeout``), as it fails an input's. Its metadata: the counts, the share,
and the ids and errors of the failed and ignored children (at most ``SHOWN_CHILDREN`` each,
cut as the IO manager's observations are), so the UI's check page shows what dagster-dbt
shows for a failed test.

Why a check of its own rather than the downstream's observation: a check is what Dagster's UI,
alerts and ``blocking=True`` (stop the downstream when it fails with ERROR) act on, and it is
tied to the fan-out asset's materialization, not to whichever step reads the flow.

Thresholds are shares of N in [0, 1], ``fail_above`` at least ``warn_above``; anything else is
refused (``InvalidInput``) when the factory is called: when the Definitions load. Partitioned
assets are refused too (their checks would need one flow per partition checked).
"""

# No ``from __future__ import annotations``: Dagster reads the check function's annotations.
import math
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    AssetsDefinition,
    MetadataValue,
    asset_check,
)

from echomq_core import FlowSnapshot, InvalidInput, JobNotFound

from .handles import EmptyFlow, read_handle
from .metadata import settled_metadata
from .reading import wait_settled
from .resource import EchoMQResource


def echomq_flow_check(
    asset: AssetsDefinition | AssetKey | str,
    *,
    name: str = "echomq_children",
    warn_above: float = 0.0,
    fail_above: float | None = None,
    blocking: bool = False,
    wait_timeout: float = 3600.0,
    stall_timeout: float | None = 120.0,
    poll_interval: float = 0.5,
    description: str | None = None,
) -> AssetChecksDefinition:
    """The asset check ``name`` on ``asset`` (a fan-out asset stored with
    ``EchoMQIOManager``) judging its flow's failed and ignored children by the share of N
    (see the module). ``blocking``: as Dagster's, an ERROR result stops the downstream of the
    asset in the same run. ``wait_timeout`` / ``stall_timeout`` / ``poll_interval``: how the
    check waits for the flow to settle, as the IO manager's settings of the same names."""
    warn, fail = _thresholds(warn_above, fail_above)
    for label, seconds in (("wait_timeout", wait_timeout), ("poll_interval", poll_interval)):
        _positive(label, seconds)
    if stall_timeout is not None:
        _positive("stall_timeout", stall_timeout)
    key = _key_of(asset)
    text = description or (
        f"Share of the EchoMQ flow's children that failed or were ignored: passes at most "
        f"{warn:.0%}" + ("" if fail is None else f", fails with ERROR above {fail:.0%}")
    )

    @asset_check(asset=key, name=name, blocking=blocking, description=text)
    def _check(context: AssetCheckExecutionContext, echomq: EchoMQResource) -> AssetCheckResult:
        client = echomq.client
        flow = read_handle(client, key.path)
        if flow is None:
            return AssetCheckResult(
                passed=False,
                severity=AssetCheckSeverity.ERROR,
                description=f"no EchoMQ flow stored for {key.to_user_string()!r} under "
                f"prefix {echomq.prefix!r}: materialize it with EchoMQIOManager first",
            )
        if isinstance(flow, EmptyFlow):  # an empty plan: no child, nothing failed
            return AssetCheckResult(passed=True, metadata={"N": MetadataValue.int(0)})
        queues = client.child_queues(flow.queue, flow.parent_id)
        try:
            with echomq.pumping([q for q in queues if q != flow.queue]):
                snap = wait_settled(
                    client,
                    flow,
                    timeout=wait_timeout,
                    stall_timeout=stall_timeout,
                    poll=poll_interval,
                    log=context.log,
                    queues=queues,
                )
        except JobNotFound as gone:  # expired with its retention: no counts left to judge
            return AssetCheckResult(
                passed=False, severity=AssetCheckSeverity.ERROR, description=str(gone)
            )
        return judge(snap, settled_metadata(client, snap), warn, fail)

    return _check


def judge(
    snap: FlowSnapshot, meta: dict[str, Any], warn: float, fail: float | None
) -> AssetCheckResult:
    """The check's result for a settled flow: pass / WARN / ERROR by the share of N that
    failed or was ignored; ERROR for a flow that failed or was cancelled as a whole."""
    bad = snap.failed + snap.ignored
    share = bad / snap.total if snap.total else 0.0
    meta = {**meta, "bad_share": MetadataValue.float(share), "warn_above": warn}
    if fail is not None:
        meta["fail_above"] = fail
    if snap.outcome != "released":
        return AssetCheckResult(
            passed=False,
            severity=AssetCheckSeverity.ERROR,
            metadata=meta,
            description=f"the flow {snap.outcome}: {bad} of {snap.total} children failed",
        )
    passed = share <= warn
    error = fail is not None and share > fail
    return AssetCheckResult(
        passed=passed,
        severity=AssetCheckSeverity.ERROR if error else AssetCheckSeverity.WARN,
        metadata=meta,
        description=f"{bad} of {snap.total} children failed or were ignored ({share:.1%})",
    )


def _thresholds(warn: Any, fail: Any) -> tuple[float, float | None]:
    def share(label: str, value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or math.isnan(value)
            or not 0.0 <= value <= 1.0
        ):
            raise InvalidInput(
                f"echomq_flow_check: {label} must be a share of the children in [0, 1] "
                f"(0.05: 5%), got {value!r:.80}"
            )
        return float(value)

    low = share("warn_above", warn)
    if fail is None:
        return low, None
    high = share("fail_above", fail)
    if high < low:
        raise InvalidInput(
            f"echomq_flow_check: fail_above ({high}) must be at least warn_above ({low}): "
            "a share that fails with ERROR is also above the warning"
        )
    return low, high


def _positive(label: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidInput(f"echomq_flow_check: {label} must be seconds > 0, got {value!r:.80}")


def _key_of(asset: AssetsDefinition | AssetKey | str) -> AssetKey:
    if isinstance(asset, AssetsDefinition):
        if len(asset.keys) != 1:
            raise InvalidInput(
                f"echomq_flow_check: {len(asset.keys)} assets in one definition "
                f"({', '.join(k.to_user_string() for k in list(asset.keys)[:3])}): pass the "
                "AssetKey of the fan-out asset"
            )
        if asset.partitions_def is not None:
            raise InvalidInput(
                f"echomq_flow_check: {asset.key.to_user_string()!r} is partitioned; a check "
                "of a partitioned fan-out is not supported (one flow per partition)"
            )
        return asset.key
    if isinstance(asset, AssetKey):
        return asset
    if isinstance(asset, str) and asset:
        return AssetKey.from_user_string(asset)
    raise InvalidInput(
        f"echomq_flow_check: asset must be the fan-out asset, its AssetKey or its key "
        f"string, got {type(asset).__name__} {asset!r:.80}"
    )
