//! `scdlfs status`: reads a mount's figures from its root's `user.scdlfs.status`
//! extended attribute and prints them for people or, with `--json`, for scripts.

use anyhow::{anyhow, Context};
use std::path::Path;
use std::time::Duration;

use crate::status::{Status, STATUS_XATTR};
use crate::units::format_size;

pub fn run(mountpoint: &Path, json: bool, watch: Option<f64>) -> anyhow::Result<()> {
    loop {
        let raw = read_status(mountpoint)?;
        if json {
            println!("{}", String::from_utf8_lossy(&raw));
        } else {
            let status: Status = serde_json::from_slice(&raw).context("unreadable status")?;
            if watch.is_some() {
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", render(&status));
        }
        match watch {
            Some(seconds) => std::thread::sleep(Duration::from_secs_f64(seconds.max(0.1))),
            None => return Ok(()),
        }
    }
}

fn read_status(mountpoint: &Path) -> anyhow::Result<Vec<u8>> {
    let mut buf = vec![0u8; 1 << 20];
    let len = rustix::fs::getxattr(mountpoint, STATUS_XATTR, &mut buf[..])
        .map_err(|error| anyhow!("{} is not a scdlfs mount ({error})", mountpoint.display()))?;
    buf.truncate(len);
    Ok(buf)
}

fn render(s: &Status) -> String {
    let c = &s.counters;
    let r = &s.rates;
    let mut out = format!(
        "source            {}\nuptime            {:.0} s\n\
         reads             {} ({} returned, {:.1}% from cache without waiting)\n\
         waited on network {} reads, {:.1} ms mean wait; {} parts no prefetch foresaw\n\
         fetched           {} in {} parts ({} errors), {} in flight\n\
         network           {}/s over the last {:.0} s, {}/s since the start\n\
         readers got       {}/s over the last {:.0} s, {}/s since the start\n\
         prefetch          {} parts asked, {} hits ({:.1}% of prefetched parts used)\n\
         cache             {} of {} in {} parts, {} chunks; {} parts evicted, {} dropped as corrupt, {} as unreadable\n",
        s.source,
        s.uptime_seconds,
        c.reads,
        format_size(c.bytes_read),
        100.0 * r.cache_hit_ratio,
        c.demand_wait_seconds.count,
        1000.0 * c.demand_wait_seconds.mean(),
        c.demand_downloads,
        format_size(c.bytes_fetched),
        c.parts_fetched,
        c.fetch_errors,
        s.downloads_in_flight,
        format_size(r.recent_fetched_bytes_per_second as u64),
        r.recent_seconds,
        format_size(r.fetched_bytes_per_second as u64),
        format_size(r.recent_read_bytes_per_second as u64),
        r.recent_seconds,
        format_size(r.read_bytes_per_second as u64),
        c.prefetch_requests,
        c.prefetch_hits,
        100.0 * r.prefetch_use_ratio,
        format_size(s.cache.cached_bytes),
        format_size(s.cache.budget_bytes),
        s.cache.cached_parts,
        s.cache.cached_groups,
        s.cache.evicted_parts,
        s.cache.corrupt_parts_dropped,
        s.cache.unreadable_parts_dropped,
    );
    out.push_str(&format!(
        "earlier mount     {} parts ({}) adopted ({} by their first read), {} ({}) not claimed yet, {} removed{}\n",
        s.cache.adopted_parts,
        format_size(s.cache.adopted_bytes),
        s.cache.adopted_by_reads,
        s.cache.unclaimed_parts,
        format_size(s.cache.unclaimed_bytes),
        s.cache.stale_parts_removed,
        if s.cache.adoption_done {
            ""
        } else {
            "; still reading their headers"
        },
    ));
    let m = &s.memory;
    out.push_str(&format!(
        "memory            {} resident (peak {}): heap {} in use, {} freed and kept\n",
        format_size(m.resident_bytes),
        format_size(m.peak_resident_bytes),
        format_size(m.heap_in_use_bytes),
        format_size(m.heap_free_kept_bytes),
    ));
    if c.listings_refreshed > 0 {
        out.push_str(&format!(
            "store changes     {} listings made again after --metadata-ttl: {} objects and {} datasets in a new version\n",
            c.listings_refreshed, c.objects_replaced, c.datasets_rediscovered
        ));
    }
    if s.cache.part_files_reopened > 0 {
        out.push_str(&format!(
            "open files        {} reads reopened a part file (more parts than the open-file limit keeps open)\n",
            s.cache.part_files_reopened
        ));
    }
    if let Some(reason) = &s.cache.disk_unusable {
        out.push_str(&format!(
            "cache disk        UNUSABLE ({reason}): serving from the store, {} parts not cached\n",
            s.cache.parts_not_cached_for_disk_errors
        ));
    }
    for plan in &s.active_plans {
        out.push_str(&format!(
            "plan              {} epoch {}: step {} of {} (uid {})\n",
            plan.dataset, plan.epoch, plan.position, plan.steps, plan.uid
        ));
    }
    for refusals in &s.hint_refusals {
        out.push_str(&format!(
            "hints refused     uid {}: {} writes or opens ({} answered late), the last: {}\n",
            refusals.uid, refusals.refused, refusals.answered_late, refusals.last_reason
        ));
    }
    out
}
