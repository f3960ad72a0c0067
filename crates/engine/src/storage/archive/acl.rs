//! POSIX ACLs as Linux stores them: the `system.posix_acl_access` and
//! `system.posix_acl_default` extended attributes, a little-endian u32
//! version (2) followed by (u16 tag, u16 perm, u32 id) entries sorted by
//! tag, then id (linux/posix_acl_xattr.h). Carried as entries whose
//! USER and GROUP ids have names (proto::attrs::AclEntry), so they map
//! by name at the sink like owners.

use ramsys_proto::attrs::{acl_tag, AclEntry, Principal};

use super::ids::Names;

pub const ACCESS: &str = "system.posix_acl_access";
pub const DEFAULT: &str = "system.posix_acl_default";
const VERSION: u32 = 2;
const UNDEFINED_ID: u32 = u32::MAX;

/// Entries of an ACL xattr value, with names for USER and GROUP ids (none
/// under `numeric`); None if the value is not a version-2 ACL.
pub fn parse(v: &[u8], names: &mut Names, numeric: bool) -> Option<Vec<AclEntry>> {
    if v.len() < 4 || !(v.len() - 4).is_multiple_of(8) {
        return None;
    }
    if u32::from_le_bytes(v[..4].try_into().ok()?) != VERSION {
        return None;
    }
    let mut out = Vec::with_capacity((v.len() - 4) / 8);
    for e in v[4..].chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let who = match tag {
            acl_tag::USER => names.user(id, numeric),
            acl_tag::GROUP => names.group(id, numeric),
            _ => Principal::default(),
        };
        out.push(AclEntry { tag, perm, who });
    }
    Some(out)
}

/// The xattr value for `entries`, USER and GROUP names mapped to this
/// system's ids (the id sent where the name is unknown), sorted as the
/// kernel requires.
pub fn encode(entries: &[AclEntry], names: &mut Names, numeric: bool) -> Vec<u8> {
    let mut es: Vec<(u16, u32, u16)> = entries
        .iter()
        .map(|e| {
            let id = match e.tag {
                acl_tag::USER => names.uid(&e.who, numeric),
                acl_tag::GROUP => names.gid(&e.who, numeric),
                _ => UNDEFINED_ID,
            };
            (e.tag, id, e.perm)
        })
        .collect();
    es.sort_unstable();
    let mut v = Vec::with_capacity(4 + 8 * es.len());
    v.extend_from_slice(&VERSION.to_le_bytes());
    for (tag, id, perm) in es {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_encode_roundtrip_and_name_mapping() {
        let mut n = Names::default();
        // user::rw- user:0:r-- group::r-- mask::r-- other::---
        let raw = encode(
            &[
                AclEntry {
                    tag: acl_tag::USER_OBJ,
                    perm: 6,
                    who: Principal::default(),
                },
                AclEntry {
                    tag: acl_tag::OTHER,
                    perm: 0,
                    who: Principal::default(),
                },
                AclEntry {
                    tag: acl_tag::USER,
                    perm: 4,
                    who: Principal {
                        id: 777,
                        name: b"root".to_vec(),
                    },
                },
                AclEntry {
                    tag: acl_tag::GROUP_OBJ,
                    perm: 4,
                    who: Principal::default(),
                },
                AclEntry {
                    tag: acl_tag::MASK,
                    perm: 4,
                    who: Principal::default(),
                },
            ],
            &mut n,
            false,
        );
        assert_eq!(raw.len(), 4 + 5 * 8);
        // Sorted by tag; "root" mapped to uid 0, not the 777 sent.
        let p = parse(&raw, &mut n, false).unwrap();
        let tags: Vec<u16> = p.iter().map(|e| e.tag).collect();
        assert_eq!(tags, [1, 2, 4, 0x10, 0x20]);
        assert_eq!(p[1].who.id, 0);
        assert_eq!(p[1].who.name, b"root");
        assert_eq!(encode(&p, &mut n, false), raw);
        // Numeric ids keep 777.
        let mut q = p.clone();
        q[1].who.id = 777;
        let num = encode(&q, &mut n, true);
        assert_eq!(parse(&num, &mut n, true).unwrap()[1].who.id, 777);
        assert!(parse(&raw[..7], &mut n, false).is_none());
        assert!(parse(&[1, 0, 0, 0], &mut n, false).is_none());
    }
}
