//! Following readers: each read served moves its plan's position (or its handle's
//! sequential window, or the scatter detector's count), and a read that touches a
//! companion file fetches the rest of what it needs.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use scdl_format::ArrayKind;

use super::exact::PAGE;
use super::plan::Touched;
use super::scatter::Decision;
use super::sequential::SequentialWindow;
use super::{ActivePlan, Prefetcher};
use crate::catalog::{Dataset, FileContent, FlatDataset, MonolithicDataset};
use crate::fetch::Fetcher;
use crate::metrics::Metrics;
use crate::parts::PartKey;
use crate::view::{plan_read, Piece, ReadPlan};

// Not a type of its own: following a read moves the plans (under their lock), the scatter detector, the ranks and the fetcher's requests, the Prefetcher's whole state.
impl Prefetcher {
    /// Called for every read served: moves the positions of user `reader`'s plans, and
    /// reads ahead for a hint-less sequential reader (`window`: the read-ahead state of
    /// its handle). Bytes `read` of the file, as asked.
    pub fn observe_read(
        &self,
        window: Option<&mut SequentialWindow>,
        reader: u32,
        content: &FileContent,
        file_size: u64,
        read: std::ops::Range<u64>,
        plan: &ReadPlan,
    ) {
        // Observed even when a plan covers the read: whether it jumped decides the
        // companion fetch ([`Prefetcher::fetch_companion`]).
        let ahead = window.map(|window| {
            window.observe(
                read.start,
                read.end - read.start,
                self.fetcher.part_size(),
                self.config.max_sequential_window,
                self.config.kernel_read_ahead,
            )
        });
        if self.plan_count.load(Ordering::Relaxed) > 0 && self.advance_plans(plan, reader) {
            return;
        }
        if let FileContent::FlatArray(dataset, kind) = content {
            self.observe_scatter(dataset, *kind, plan);
        }
        if let Some(ahead) = ahead.filter(|ahead| !ahead.is_empty()) {
            let read_ahead = plan_read(content, file_size, ahead.start, ahead.end - ahead.start);
            for piece in &read_ahead.pieces {
                if let Piece::Object { object, range, .. } = piece {
                    for index in self.fetcher.parts_of(range) {
                        self.fetcher.prefetch(object, index);
                    }
                }
            }
        }
    }

    /// A reader of a row takes its values, then its column ids (or the other way
    /// round): a read of the same elements of the other array follows a read of one at
    /// once. When the first waits on the network, the bytes of the second are asked for
    /// beside it, on their own (an edge, kept in memory), so the second read does not
    /// wait a round trip more. They are asked for at demand priority: as a prefetch
    /// they queued behind a plan's prefetches, and the second read asked for them
    /// itself, a round trip later. Called for reads the cache could not serve that jumped
    /// (a memory map's fault at a row; not a reader going through a whole file, which
    /// reads the other later, if at all).
    pub fn fetch_companion(&self, content: &FileContent, offset: u64, len: u64) {
        let FileContent::FlatArray(dataset, kind) = content else {
            return;
        };
        let other = match kind {
            ArrayKind::Data => ArrayKind::ColPtr,
            ArrayKind::ColPtr => ArrayKind::Data,
            ArrayKind::RowPtr => return,
        };
        // The kernel reads both memory-mapped files the same way: a window of the same
        // length centred on the page of the fault. The other window is centred on the
        // same element, a page wider on each side for the rounding.
        let layout = &dataset.layout;
        let (width, other_width) = (layout.width(*kind), layout.width(other));
        let centre = (offset + len / 2) / width * other_width;
        let start = centre.saturating_sub(len / 2 + PAGE);
        let companion = plan_read(
            &FileContent::FlatArray(dataset.clone(), other),
            layout.file_len(other),
            start,
            len + 2 * PAGE,
        );
        for piece in &companion.pieces {
            let Piece::Object { object, range, .. } = piece else {
                continue;
            };
            for index in self.fetcher.parts_of(range) {
                let part = self.fetcher.part_range(object, index);
                let within = range.start.max(part.start)..range.end.min(part.end);
                if within != part && self.worth_an_edge(&within) {
                    self.fetcher.edge_for_next_read(object, within);
                } else {
                    // Most of a part, or all of a small one: the part itself, which the
                    // second read joins (as an edge it would be fetched again as a part).
                    self.fetcher.part_for_next_read(object, index);
                }
            }
        }
    }

    /// Feeds a hint-less read of a flat array to the scatter detector, and fetches the
    /// chunks it names whole: all parts of the chunk's three arrays, at prefetch
    /// priority, unless the chunk is larger than the bytes allowed ahead.
    fn observe_scatter(&self, dataset: &Arc<FlatDataset>, kind: ArrayKind, read: &ReadPlan) {
        let array = ArrayKind::ALL.iter().position(|&k| k == kind).unwrap();
        let part_size = self.fetcher.part_size();
        let mut scatter = self.scatter.lock();
        for (chunk, _, range) in read.chunk_pieces() {
            let id = dataset.array(chunk, ArrayKind::Data).id.0;
            let touched: Vec<u64> = self
                .fetcher
                .parts_of(range)
                .map(|index| chunk_part(array, index))
                .collect();
            if scatter.observe(id, array, range.start, touched.iter().copied())
                != Decision::FetchChunk
            {
                continue;
            }
            let objects = &dataset.chunks[chunk];
            let bytes: u64 = objects.iter().map(|o| o.size).sum();
            if bytes > self.config.max_ahead_bytes {
                continue;
            }
            let mut parts = Vec::new();
            for (array, object) in objects.iter().enumerate() {
                for index in 0..object.size.div_ceil(part_size) {
                    self.fetcher.prefetch(object, index);
                    parts.push(chunk_part(array, index));
                }
            }
            Metrics::add(&self.metrics.chunks_fetched_whole, 1);
            scatter.fetching(id, parts, &touched);
        }
    }

    /// Moves the positions of user `reader`'s plans whose dataset the read touches,
    /// through either view, and marks them read from. Returns whether any of them
    /// covers the read's dataset. Another user's reads move no plan: a writer's plan
    /// over every row was read along by every reader of its dataset.
    fn advance_plans(&self, read: &ReadPlan, reader: u32) -> bool {
        let mut touched: Vec<(Dataset, Option<usize>, PartKey)> = Vec::new();
        {
            let index = self.chunk_of_group.lock();
            for piece in &read.pieces {
                if let Piece::Object { object, range, .. } = piece {
                    if let Some((dataset, chunk)) = object.group.and_then(|g| index.get(&g)) {
                        for part in self.fetcher.parts_of(range) {
                            touched.push((
                                Dataset::Chunked(dataset.clone()),
                                Some(*chunk),
                                Fetcher::key(object, part),
                            ));
                        }
                    }
                }
            }
        }
        let mut plans = self.plans.lock();
        self.touched_monolithic(&plans, read, &mut touched);
        if touched.is_empty() {
            return false;
        }
        let (mut covered, mut moved) = (false, false);
        for (handle, active) in plans.iter_mut().filter(|(_, a)| a.uid == reader) {
            let mut read = Touched::default();
            for (dataset, chunk, part) in &touched {
                if dataset.same(&active.dataset) {
                    read.chunks.extend(chunk);
                    read.parts.push(*part);
                }
            }
            if read.parts.is_empty() {
                continue;
            }
            covered = true;
            // A plan's first read gives it its standing: its ranks and prefetches.
            moved |= !std::mem::replace(&mut active.read_from, true);
            if active.plan.observe(&read, &active.dataset.geometry()) {
                moved = true;
                self.note_finished(*handle, active);
            }
        }
        if moved {
            self.after_plans_changed(&plans);
            drop(plans);
            self.wake.ring();
        }
        covered
    }

    /// What a read touches of the monolithic datasets that have plans: the parts of
    /// their values and column ids (a step's own), and the virtual chunks of the row
    /// offsets it reads. Row-offset parts are no step's own: one part holds the offsets
    /// of many steps.
    fn touched_monolithic(
        &self,
        plans: &HashMap<u64, ActivePlan>,
        read: &ReadPlan,
        touched: &mut Vec<(Dataset, Option<usize>, PartKey)>,
    ) {
        let mut seen: Vec<&Arc<MonolithicDataset>> = Vec::new();
        for active in plans.values() {
            let Dataset::Monolithic(dataset) = &active.dataset else {
                continue;
            };
            if seen.iter().any(|d| Arc::ptr_eq(d, dataset)) {
                continue;
            }
            seen.push(dataset);
            for piece in &read.pieces {
                let Piece::Object { object, range, .. } = piece else {
                    continue;
                };
                let Some(kind) = ArrayKind::ALL
                    .into_iter()
                    .find(|&k| Arc::ptr_eq(dataset.array(k), object))
                else {
                    continue;
                };
                if kind == ArrayKind::RowPtr {
                    let width = dataset.width(kind);
                    let rows = range.start / width..range.end.div_ceil(width);
                    for chunk in dataset.geometry.chunks_of_rows(rows) {
                        // The part stands for the read; it is in no resolved step.
                        let part = Fetcher::key(object, range.start / self.fetcher.part_size());
                        touched.push((active.dataset.clone(), Some(chunk as usize), part));
                    }
                } else {
                    for part in self.fetcher.parts_of(range) {
                        touched.push((active.dataset.clone(), None, Fetcher::key(object, part)));
                    }
                    // Once the offsets around the values were read, the read names its
                    // virtual chunks too: steps not resolved yet are matched by those.
                    let width = dataset.width(kind);
                    let values = range.start / width..range.end.div_ceil(width);
                    if let Some((first, last)) = dataset.chunks_of_values(values) {
                        let part = Fetcher::key(object, range.start / self.fetcher.part_size());
                        for chunk in first..=last {
                            touched.push((active.dataset.clone(), Some(chunk as usize), part));
                        }
                    }
                }
            }
        }
    }

    /// Called with the bytes of every read served while plans exist: the row offsets a
    /// reader of a monolithic dataset reads locate its virtual chunks, for matching its
    /// reads to steps and for ranking their parts, however far the prefetch lags.
    pub fn observe_served(&self, content: &FileContent, offset: u64, bytes: &[u8]) {
        if self.plan_count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let FileContent::Object(object) = content else {
            return;
        };
        let plans = self.plans.lock();
        // The object is one dataset's, however many plans follow that dataset.
        let dataset = plans.values().find_map(|active| match &active.dataset {
            Dataset::Monolithic(dataset)
                if Arc::ptr_eq(dataset.array(ArrayKind::RowPtr), object) =>
            {
                Some(dataset)
            }
            _ => None,
        });
        if dataset.is_some_and(|d| d.remember_served_row_offsets(offset, bytes)) {
            self.after_plans_changed(&plans);
        }
    }
}

/// A part of a chunk, numbered uniquely within the chunk: its array's number and index.
fn chunk_part(array: usize, index: u64) -> u64 {
    ((array as u64) << 48) | index
}
