//! The source's part of a sync: turn the sink's Have answer into a read
//! plan (skip unchanged files, read only differing blocks of the others)
//! and the Reuse verdicts the sink needs to build its files.

use std::collections::HashMap;

use ramsys_proto::control::{Have, HaveState, Reuse, ReuseKind};

use crate::data::queue::{DeviceQueue, ReadUnit};
use crate::storage::fsops::Root;
use crate::types::file::SourceFile;

/// What to read of each file, by index in the walk's file list.
#[derive(Debug, Default)]
pub struct SyncPlan {
    /// None: read whole; Some(ranges): just these (delta).
    pub ranges: Vec<Option<Vec<(u64, u64)>>>,
    /// Not sent at all (unchanged, identical content, or dry run).
    pub skip: Vec<bool>,
    pub reuse: Vec<Reuse>,
    /// Files not sent at all.
    pub unchanged: u64,
    /// Dry run: indices of the files that would be sent.
    pub planned: Vec<usize>,
    /// Dry run: ids of the records not files the sink would make (its
    /// Have for one, docs/PROTOCOL.md).
    pub made: Vec<u64>,
}

impl SyncPlan {
    pub fn skipped(&self, idx: usize) -> bool {
        self.skip[idx]
    }

    /// Bytes to read of file `idx`.
    pub fn bytes(&self, idx: usize, size: u64) -> u64 {
        if self.skip[idx] {
            return 0;
        }
        match &self.ranges[idx] {
            None => size,
            Some(r) => r.iter().map(|x| x.1).sum(),
        }
    }

    /// File `i` (entry `id`) after its comparison.
    fn note(&mut self, i: usize, id: u64, v: Verdict) {
        match v {
            Verdict::Whole => {}
            Verdict::Keep => {
                self.skip[i] = true;
                self.unchanged += 1;
                self.reuse.push(Reuse {
                    id,
                    what: ReuseKind::Keep,
                });
            }
            Verdict::Base(r, reused) => {
                self.ranges[i] = Some(r);
                self.reuse.push(Reuse {
                    id,
                    what: ReuseKind::Base { bytes: reused },
                });
            }
        }
    }
}

/// The sink's Have answer as it arrives: Unchanged ids as runs (first id,
/// count; the sink sends them in id order, so a no-change re-sync of a
/// million files keeps a few thousand runs instead of a 48-byte Have per
/// file, issue 36), the rest as sent.
#[derive(Debug, Default)]
pub struct Answer {
    unchanged: Vec<(u64, u64)>,
    other: Vec<Have>,
}

impl Answer {
    /// `later`, an answer for higher ids (a windowed sync's next window),
    /// after this one.
    pub fn append(&mut self, later: Answer) {
        for (first, n) in later.unchanged {
            match self.unchanged.last_mut() {
                Some((f, m)) if *f + *m == first => *m += n,
                _ => self.unchanged.push((first, n)),
            }
        }
        self.other.extend(later.other);
    }

    /// A dry run's answer for records that are not files: the ids of
    /// those the sink would make (any Have for one, docs/PROTOCOL.md).
    pub fn made(self) -> Vec<u64> {
        self.other.into_iter().map(|h| h.id).collect()
    }

    pub fn extend(&mut self, v: Vec<Have>) {
        for h in v {
            match h.state {
                HaveState::Unchanged => match self.unchanged.last_mut() {
                    Some((first, n)) if *first + *n == h.id => *n += 1,
                    _ => self.unchanged.push((h.id, 1)),
                },
                _ => self.other.push(h),
            }
        }
    }
}

enum Job {
    Digest(u64),
    Blocks(u32, u64, Vec<u64>),
}

#[derive(Clone, Default)]
enum Verdict {
    #[default]
    Whole,
    Keep,
    Base(Vec<(u64, u64)>, u64),
}

/// Compare in parallel (each side hashes what it holds) and plan.
pub fn plan(root: &Root, files: &[SourceFile], haves: Answer, dry: bool, max_run: u64) -> SyncPlan {
    let mut p = SyncPlan {
        ranges: vec![None; files.len()],
        skip: vec![false; files.len()],
        ..Default::default()
    };
    let jobs = comparisons(files, haves, dry, &mut p);
    let same = same_file(files, &jobs);
    let idx: Vec<usize> = (0..jobs.len()).collect();
    let mut verdicts =
        crate::request::sync::par_map(&idx, crate::request::sync::hash_threads(), |&k| {
            let (i, job) = &jobs[k];
            if same[k].is_some() {
                return Verdict::Whole;
            }
            compare(root, &files[*i], job, max_run)
        });
    for (k, j) in same.iter().enumerate() {
        if let Some(j) = *j {
            verdicts[k] = verdicts[j].clone();
        }
    }
    for ((i, _), v) in jobs.iter().zip(verdicts) {
        p.note(*i, files[*i].id, v);
    }
    if dry {
        for (i, s) in p.skip.iter_mut().enumerate() {
            if !*s {
                p.planned.push(i);
            }
            *s = true;
        }
    }
    p
}

/// What to compare per file the sink holds, by index into `files`; files
/// it says are unchanged are skipped in `p` at once.
fn comparisons(
    files: &[SourceFile],
    haves: Answer,
    dry: bool,
    p: &mut SyncPlan,
) -> Vec<(usize, Job)> {
    let by_id = crate::types::file::IdIndex::new(files);
    for &(first, n) in &haves.unchanged {
        // Ids of a run are consecutive files of the list: one search a run.
        let mut next = None;
        for id in first..first + n {
            let at = match next {
                Some(j) if files.get(j).is_some_and(|f: &SourceFile| f.id == id) => Some(j),
                _ => by_id.get(files, id),
            };
            if let Some(i) = at {
                p.skip[i] = true;
                p.unchanged += 1;
            }
            next = at.map(|i| i + 1);
        }
    }
    let mut jobs: Vec<(usize, Job)> = Vec::new();
    for h in haves.other {
        let Some(i) = by_id.get(files, h.id) else {
            // A symlink, hard link or special record a dry run would make.
            if dry {
                p.made.push(h.id);
            }
            continue;
        };
        match h.state {
            HaveState::Unchanged => {
                p.skip[i] = true;
                p.unchanged += 1;
            }
            HaveState::Digest(d) => jobs.push((i, Job::Digest(d))),
            HaveState::Blocks {
                block_size,
                size,
                sums,
            } => {
                // A piece (issue 19) is sent whole or not at all.
                if block_size >= 4096 && !dry && files[i].range.is_none() {
                    jobs.push((i, Job::Blocks(block_size, size, sums)));
                }
            }
        }
    }
    jobs
}

/// The pieces of one big file (issue 19) compare the same whole file
/// (`-c`): hashed once, by the first; per job, that first one.
fn same_file(files: &[SourceFile], jobs: &[(usize, Job)]) -> Vec<Option<usize>> {
    let mut first: HashMap<(&[u8], u64), usize> = HashMap::new();
    (jobs.iter().enumerate())
        .map(|(k, (i, job))| match job {
            Job::Digest(d) => match first.get(&(&files[*i].rel[..], *d)) {
                Some(&j) => Some(j),
                None => {
                    first.insert((&files[*i].rel[..], *d), k);
                    None
                }
            },
            Job::Blocks(..) => None,
        })
        .collect()
}

/// Our side of one comparison: the whole file matches, differs, or
/// differs in the ranges to send.
fn compare(root: &Root, f: &SourceFile, job: &Job, max_run: u64) -> Verdict {
    let Ok(file) = root.open_read(&f.rel, false) else {
        return Verdict::Whole;
    };
    match job {
        Job::Digest(d) => match crate::request::sync::content_digest(file) {
            Ok(x) if x == *d => Verdict::Keep,
            _ => Verdict::Whole,
        },
        Job::Blocks(bs, base_size, sums) => {
            match crate::request::sync::block_sums(&file, f.id, f.size, *bs, &|_| true) {
                Ok(ours) => {
                    let (r, reused) = crate::request::sync::diff_ranges(
                        &ours, sums, *bs, f.size, *base_size, max_run,
                    );
                    Verdict::Base(r, reused)
                }
                Err(_) => Verdict::Whole,
            }
        }
    }
}

/// Restrict the read queues to the plan: skipped files vanish, delta files
/// keep only their differing ranges.
pub fn restrict(queues: &mut [DeviceQueue], p: &SyncPlan) {
    for q in queues.iter_mut() {
        let mut units = Vec::with_capacity(q.units.len());
        for u in q.units.iter().filter(|u| !p.skip[u.file as usize]) {
            match &p.ranges[u.file as usize] {
                None => units.push(*u),
                Some(rs) => {
                    for &(o, l) in rs {
                        let s = o.max(u.offset);
                        let e = (o + l).min(u.offset + u.len());
                        if s < e {
                            units.push(ReadUnit::new(u.file, s, e - s));
                        }
                    }
                }
            }
        }
        q.bytes = units.iter().map(|u| u.len()).sum();
        q.units = units;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have(id: u64, state: HaveState) -> Have {
        Have { id, state }
    }

    /// A windowed sync's answers, window after window (issue 36): the
    /// Unchanged runs join across the windows' border, the rest is kept
    /// in order, and the whole equals the answer given at once.
    #[test]
    fn answers_of_later_windows_append_as_one() {
        let given = |ids: std::ops::Range<u64>| {
            let mut a = Answer::default();
            let v = ids.map(|id| match id % 10 {
                7 => have(id, HaveState::Digest(id)),
                _ => have(id, HaveState::Unchanged),
            });
            a.extend(v.collect());
            a
        };
        let mut windows = given(0..25);
        windows.append(given(25..40));
        windows.append(Answer::default());
        windows.append(given(40..60));
        let whole = given(0..60);
        assert_eq!(windows.unchanged, whole.unchanged);
        assert_eq!(windows.unchanged[..2], [(0, 7), (8, 9)]);
        let ids = |a: &Answer| a.other.iter().map(|h| h.id).collect::<Vec<_>>();
        assert_eq!(ids(&windows), [7, 17, 27, 37, 47, 57]);
        assert_eq!(ids(&windows), ids(&whole));
    }
}
