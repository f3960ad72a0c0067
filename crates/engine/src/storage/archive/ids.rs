//! Cached user and group lookups (the system's passwd and group databases
//! through getpwuid_r and friends, crate `uzers`): the source names each
//! owner once, the sink maps each name once, however many files share it.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use ramsys_proto::attrs::Principal;

#[derive(Default)]
pub struct Names {
    user_names: HashMap<u32, Vec<u8>>,
    group_names: HashMap<u32, Vec<u8>>,
    uids: HashMap<Vec<u8>, Option<u32>>,
    gids: HashMap<Vec<u8>, Option<u32>>,
}

impl Names {
    /// The source's view of a user: id and name (none under numeric ids,
    /// or when the id has no name here).
    pub fn user(&mut self, uid: u32, numeric: bool) -> Principal {
        let name = if numeric {
            Vec::new()
        } else {
            self.user_names
                .entry(uid)
                .or_insert_with(|| {
                    uzers::get_user_by_uid(uid)
                        .map(|u| u.name().as_bytes().to_vec())
                        .unwrap_or_default()
                })
                .clone()
        };
        Principal { id: uid, name }
    }

    pub fn group(&mut self, gid: u32, numeric: bool) -> Principal {
        let name = if numeric {
            Vec::new()
        } else {
            self.group_names
                .entry(gid)
                .or_insert_with(|| {
                    uzers::get_group_by_gid(gid)
                        .map(|g| g.name().as_bytes().to_vec())
                        .unwrap_or_default()
                })
                .clone()
        };
        Principal { id: gid, name }
    }

    /// The sink's uid for a user: by name where the name exists here
    /// (rsync's rule), else the source's id.
    pub fn uid(&mut self, p: &Principal, numeric: bool) -> u32 {
        if numeric || p.name.is_empty() {
            return p.id;
        }
        self.uids
            .entry(p.name.clone())
            .or_insert_with(|| uzers::get_user_by_name(OsStr::from_bytes(&p.name)).map(|u| u.uid()))
            .unwrap_or(p.id)
    }

    pub fn gid(&mut self, p: &Principal, numeric: bool) -> u32 {
        if numeric || p.name.is_empty() {
            return p.id;
        }
        self.gids
            .entry(p.name.clone())
            .or_insert_with(|| {
                uzers::get_group_by_name(OsStr::from_bytes(&p.name)).map(|g| g.gid())
            })
            .unwrap_or(p.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_and_fall_back_to_ids() {
        let mut n = Names::default();
        // root is uid 0 and group 0 on every Linux system.
        assert_eq!(n.user(0, false).name, b"root");
        assert!(n.user(0, true).name.is_empty());
        assert_eq!(n.group(0, false).name, b"root");
        let named = |id, name: &str| Principal {
            id,
            name: name.as_bytes().to_vec(),
        };
        // A name that exists maps to its id here, whatever the source's.
        assert_eq!(n.uid(&named(4242, "root"), false), 0);
        assert_eq!(n.uid(&named(4242, "root"), true), 4242);
        assert_eq!(n.gid(&named(4243, "root"), false), 0);
        // A name unknown here falls back to the id.
        assert_eq!(n.uid(&named(4244, "no-such-user-ramsys"), false), 4244);
        assert_eq!(n.gid(&named(4245, ""), false), 4245);
    }
}
