//! The measurements of the scenarios run in process (push, consume, steady state, parked
//! long-polls, partition scaling with the admin totals, fan-out, wakes): each adds its rows to
//! the run. `measure` in main.rs is the registry: which scenario runs, in what order.

use crate::args::Scenario;
use crate::util::{self, Row};
use crate::{admin, consume, limiter, live, parked, push, scaling, wake};
use crate::{start_app, Run, ALLOCATOR, DB_NAME};

/// Scenario 1: Push throughput per batch size, against (a) rows and (b) segments.
pub(crate) async fn measure_push(run: &mut Run) {
    let batches = run.args.push_batches.clone();
    for batch in batches {
        let rows = push::push_scenario(run.addr, &run.cfg, batch, run.plan.secs).await;
        run.rows.extend(rows);
        eprintln!("measured push, batch {batch}");
    }
}

/// Scenario 2: Consume throughput per (partitions, consumers) shape, against (c) the claim loop.
pub(crate) async fn measure_consume(run: &mut Run) {
    let shapes = run.args.consume_shapes.clone();
    for shape in shapes {
        let (partitions, consumers) = (shape.partitions, shape.consumers);
        let rows = consume::consume_scenario(
            &run.app,
            run.addr,
            &run.cfg,
            partitions,
            consumers,
            run.plan.consume_total,
        )
        .await;
        run.rows.extend(rows);
        eprintln!("measured consume, {partitions} partitions, {consumers} consumers");
    }
    let total = run.plan.consume_one_total;
    let rows = consume::consume_one_at_a_time(&run.app, run.addr, &run.cfg, total, "consume").await;
    run.rows.extend(rows);
}

/// Scenario 3, steady state: the maximum first, then 10% of it, each against the raw pipeline. The
/// fan-out scenario needs its calm rate and p99 even when the steady rows are not wanted.
pub(crate) async fn measure_steady(run: &mut Run) {
    let secs = run.plan.steady_secs;
    let max = live::run(run.addr, "steady-max", 1, 4, None, secs).await;
    // --offered fixes the calm rate, so runs of two builds offer the same load.
    run.offered = run
        .args
        .offered
        .unwrap_or_else(|| (max.delivered * 0.1).max(100.0));
    let offered = run.offered;
    let calm = live::run(run.addr, "steady-10pct", 1, 4, Some(offered), secs).await;
    run.calm_p99 = calm.groups[0].p99;
    if run.args.runs(Scenario::Steady) {
        let raw_max = live::raw_run(&run.cfg, None, secs).await;
        let raw_calm = live::raw_run(&run.cfg, Some(offered), secs).await;
        for (label, b, r) in [
            ("steady state, maximum".to_string(), &max, &raw_max),
            (
                format!("steady state, {offered:.0} msg/s offered (10% of max)"),
                &calm,
                &raw_calm,
            ),
        ] {
            let raw = "NOTIFY + claim loop";
            let (bg, rg) = (&b.groups[0], &r.groups[0]);
            run.rows.extend([
                Row::new(
                    label.clone(),
                    "delivered msg/s",
                    b.delivered,
                    raw,
                    r.delivered,
                ),
                Row::new(label.clone(), "p50 ms", bg.p50, raw, rg.p50),
                Row::new(label.clone(), "p99 ms", bg.p99, raw, rg.p99),
                Row::new(label, "max ms", bg.max, raw, rg.max),
            ]);
        }
    }
    eprintln!("measured steady state");
}

/// Scenario 4: Parked long-polls, hot-list on and off, against 1 Hz raw pollers.
pub(crate) async fn measure_parked(run: &mut Run) {
    let counts = run
        .args
        .parked
        .clone()
        .unwrap_or_else(|| run.plan.parked.to_vec());
    let secs = run.plan.parked_secs;
    for consumers in counts {
        let raw = parked::raw_pollers(&run.cfg, DB_NAME, consumers, secs).await;
        for hotlist in [true, false] {
            let p =
                parked::broker_run(&run.db_url, DB_NAME, &run.cfg, hotlist, consumers, secs).await;
            run.rows.extend(parked::rows(consumers, hotlist, &p, raw));
            eprintln!("measured parked, {consumers} long-polls, hotlist {hotlist}");
        }
    }
}

/// Scenario 5, partition scaling: the wildcard scan (QUEEN_HOTLIST=0) and the hot-list path, each
/// size against the smallest.
pub(crate) async fn measure_scaling(run: &mut Run) {
    let (_wild, wild_addr) = start_app(&run.pg, false).await;
    let mut smallest: [Option<scaling::Scaling>; 2] = [None, None];
    let mut sizes = run
        .args
        .scaling_sizes
        .clone()
        .unwrap_or_else(|| run.plan.sizes.to_vec());
    sizes.sort_unstable();
    for size in sizes {
        let queue = format!("scale-{size}");
        scaling::prefill(&run.pg, &run.cfg, &queue, size).await;
        let paths = [
            ("wildcard pop", wild_addr, "wild"),
            ("hot-list pop", run.addr, "hot"),
        ];
        for (k, (path, at, group)) in paths.into_iter().enumerate() {
            // --scaling-paths hot (or wild) runs one path (to profile it alone).
            if !run.args.scaling_paths.iter().any(|p| p == group) {
                continue;
            }
            let s = scaling::run(at, &queue, group, run.plan.secs).await;
            let base = smallest[k].as_ref().unwrap_or(&s);
            let label = format!("{path}, batch 10, {size} partitions");
            let vs = format!("{} partitions", run.plan.sizes[0]);
            run.rows.extend([
                Row::new(label.clone(), "msg/s", s.rate, vs.clone(), base.rate),
                Row::new(
                    label.clone(),
                    "pop p99 ms",
                    s.pop.p99,
                    vs.clone(),
                    base.pop.p99,
                ),
                Row::new(
                    label.clone(),
                    "first contact ms",
                    s.first_contact_ms,
                    vs.clone(),
                    base.first_contact_ms,
                ),
                Row::new(
                    label,
                    "a later new group's first contact ms (median of 5)",
                    s.later_contact_ms,
                    vs,
                    base.later_contact_ms,
                ),
            ]);
            if smallest[k].is_none() {
                smallest[k] = Some(s);
            }
        }
        weigh_ring(run, &queue, size);
        measure_admin_totals(run, &queue, size).await;
        eprintln!("measured scaling, {size} partitions");
    }
}

/// The admin totals once the database holds the scaling queues so far: a pass over every
/// partition, and the totals routes answered from it (each against the pass).
pub(crate) async fn measure_admin_totals(run: &mut Run, queue: &str, size: usize) {
    let t = admin::measure(run.addr, queue).await;
    let label = format!("admin totals, {size}-partition queue");
    let vs = "a pass over every partition, ms";
    run.rows.extend([
        Row::new(
            label.clone(),
            "pass ms (POST /stats/refresh)",
            t.pass_ms,
            "partitions read",
            t.partitions,
        ),
        Row::new(
            label.clone(),
            "queue listing ms (median of 5)",
            t.listing_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "consumer groups ms (median of 5)",
            t.groups_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "overview ms (median of 5)",
            t.overview_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "its depth for a group ms (median of 5)",
            t.depth_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "its first page of partitions ms (median of 5)",
            t.queue_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "its status view ms (median of 5)",
            t.queue_status_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "a group's partitions on it ms (median of 5)",
            t.group_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "its messages, first page, ms (median of 5)",
            t.messages_ms,
            vs,
            t.pass_ms,
        ),
    ]);
    for (metric, ms) in [
        ("status ms (median of 5)", t.status_ms),
        ("lagging cursors ms (median of 5)", t.lagging_ms),
        ("its dead letters ms (median of 5)", t.dlq_ms),
        ("trace names ms (median of 5)", t.trace_names_ms),
    ] {
        run.rows
            .push(Row::new(label.clone(), metric, ms, vs, t.pass_ms));
    }
}

/// What the hot-list ring holds after a scaling run, and what its entries cost: live heap bytes
/// before and after the queue's rings are dropped.
fn weigh_ring(run: &mut Run, queue: &str, size: usize) {
    let label = format!("hot-list ring, {size} partitions");
    let (entries, freed) = {
        let mut ctx = queen_server::lock(&run.app.pop_ctx);
        let entries = ctx.rings.entry_count();
        let region = stats_alloc::Region::new(&ALLOCATOR);
        ctx.rings.forget_queue(queue);
        let change = region.change();
        (
            entries,
            change.bytes_deallocated as i64 - change.bytes_allocated as i64,
        )
    };
    run.rows.extend([
        Row::new(
            label.clone(),
            "entries after the run",
            entries as f64,
            "partitions",
            size as f64,
        ),
        Row::new(
            label.clone(),
            "heap bytes per entry",
            freed as f64 / entries.max(1) as f64,
            "-",
            f64::NAN,
        ),
        Row::new(
            label,
            "bench process RSS MiB (broker in-process)",
            util::rss_mib("self"),
            "-",
            f64::NAN,
        ),
    ]);
}

/// Scenario 6: Fan-out at the calm offered rate: every group must receive every message.
pub(crate) async fn measure_fan_out(run: &mut Run) {
    let counts = run
        .args
        .fanout_groups
        .clone()
        .unwrap_or_else(|| run.plan.fan_out_groups.to_vec());
    let (offered, calm_p99) = (run.offered, run.calm_p99);
    // CPU per delivery of the first (fewest groups) run: what a delivery costs when few groups
    // share the pushes.
    let mut first_cost: Option<(usize, f64, f64)> = None;
    for groups in counts {
        let trace = limiter::LimitTrace::start(&run.app, std::time::Duration::from_millis(100));
        let name = format!("fanout-{groups}");
        let cpu = util::CpuMark::now();
        let r = live::run(run.addr, &name, groups, 2, Some(offered), run.plan.secs).await;
        let (broker_per_cpu_s, pg_per_cpu_s) = cpu.messages_per_cpu_second(r.deliveries as f64);
        let (broker_us, pg_us) = (1e6 / broker_per_cpu_s, 1e6 / pg_per_cpu_s);
        let (first_groups, first_broker_us, first_pg_us) =
            *first_cost.get_or_insert((groups, broker_us, pg_us));
        let worst = r.groups.iter().map(|l| l.p99).fold(0.0, f64::max);
        let spread: Vec<String> = r
            .groups
            .iter()
            .map(|l| format!("{:.1}/{:.1}/{:.0}", l.p50, l.p99, l.max))
            .collect();
        eprintln!(
            "fan-out {groups} groups, p50/p99/max ms per group (steady 10% p99 {calm_p99:.1}): {}",
            spread.join(" ")
        );
        let label = format!("fan-out, {groups} groups, {offered:.0} msg/s offered");
        let ideal = offered * groups as f64;
        run.rows.extend([
            Row::new(
                label.clone(),
                "deliveries/s",
                r.delivered,
                "offered x groups",
                ideal,
            ),
            Row::new(
                label.clone(),
                "worst group p99 ms",
                worst,
                "steady 10% p99",
                calm_p99,
            ),
            Row::new(
                label.clone(),
                "broker CPU us per delivery",
                broker_us,
                format!("{first_groups} group(s)"),
                first_broker_us,
            ),
            Row::new(
                label.clone(),
                "PG CPU us per delivery",
                pg_us,
                format!("{first_groups} group(s)"),
                first_pg_us,
            ),
        ]);
        let samples = trace.stop().await;
        run.rows.extend(limiter::trace_rows(&label, &samples));
        run.limiter_series
            .push(limiter::trace_json(&label, &samples));
        eprintln!("measured fan-out, {groups} groups");
    }
}

/// Scenario 7, wake latency per event: the consumer parks on broker B; the event happens on B
/// (one broker) or on A (across two). Re-checks are 60 s apart there: only events deliver.
pub(crate) async fn measure_wake(run: &mut Run) {
    let (_a, a_addr) = wake::start_broker(&run.pg, 11).await;
    let (_b, b_addr) = wake::start_broker(&run.pg, 12).await;
    let samples = if run.plan.quick { 10 } else { 100 };
    for kind in wake::KINDS {
        for across in [false, true] {
            let actor = if across { a_addr } else { b_addr };
            let tag = if across { "x" } else { "o" };
            let (l, n) = wake::run(kind, actor, b_addr, tag, samples).await;
            run.rows.extend(wake::rows(kind, across, &l, n));
        }
    }
    eprintln!("measured wake latency");
}
