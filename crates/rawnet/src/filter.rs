//! Classic BPF socket filters for raw channels (issue 18; docs/TYCHE.md
//! "Kernel path"). Every AF_PACKET socket bound to an interface and our
//! EtherType gets a copy of every such frame, so without a filter N
//! channels on one interface cost N copies and N wake-ups per frame, and
//! the listener wakes for every data frame. With `SO_ATTACH_FILTER`:
//!
//! - a channel's socket keeps only frames of its channel number (header
//!   offset 24), so the other channels' frames never reach it;
//! - a listener's socket keeps only OPEN frames (kind, offset 5).
//!
//! The filter deliberately does not match session or token: a frame of
//! the right channel number with a wrong session or token (a forger on
//! the segment, a stale channel) still reaches the endpoint, which drops
//! and *counts* it (`forged_session`, `forged_token`); channel numbers
//! are random-based per agent, so channels of two agents rarely share
//! one. Offsets are from the start of the Ethernet frame (SOCK_RAW).

use std::io;
use std::os::fd::RawFd;

use crate::frame::{Kind, ETH_HDR};

// BPF opcodes (linux/bpf_common.h): class | size | mode.
const BPF_LD: u16 = 0x00;
const BPF_H: u16 = 0x08;
const BPF_B: u16 = 0x10;
const BPF_ABS: u16 = 0x20;
const BPF_JMP: u16 = 0x05;
const BPF_JEQ: u16 = 0x10;
const BPF_K: u16 = 0x00;
const LD_H_ABS: u16 = BPF_LD | BPF_H | BPF_ABS;
const LD_B_ABS: u16 = BPF_LD | BPF_B | BPF_ABS;
const JEQ_K: u16 = BPF_JMP | BPF_JEQ | BPF_K;
const RET_K: u16 = 0x06;

const OFF_KIND: u32 = (ETH_HDR + 5) as u32;
const OFF_CHANNEL: u32 = (ETH_HDR + 24) as u32;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Load (`ld_code`) the field at `off`, keep the frame if it equals `v`.
fn equals(ld_code: u16, off: u32, v: u32) -> [libc::sock_filter; 4] {
    [
        insn(ld_code, 0, 0, off),
        insn(JEQ_K, 0, 1, v),
        insn(RET_K, 0, 0, u32::MAX),
        insn(RET_K, 0, 0, 0),
    ]
}

/// A channel socket's program: frames of channel `channel` only.
pub fn channel_program(channel: u16) -> [libc::sock_filter; 4] {
    equals(LD_H_ABS, OFF_CHANNEL, channel as u32)
}

/// A listener socket's program: OPEN frames only.
pub fn open_program() -> [libc::sock_filter; 4] {
    equals(LD_B_ABS, OFF_KIND, Kind::Open as u32)
}

/// Attach `prog` to socket `fd` (replacing any earlier filter).
pub fn attach(fd: RawFd, prog: &[libc::sock_filter]) -> io::Result<()> {
    let p = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: setsockopt with a sock_fprog pointing at `prog`, which
    // outlives the call (the kernel copies the program).
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &p as *const libc::sock_fprog as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Run a program the way the kernel does, for the tests (only the
/// instructions used above).
#[cfg(test)]
fn run(prog: &[libc::sock_filter], frame: &[u8]) -> u32 {
    let mut a = 0u32;
    let mut pc = 0usize;
    loop {
        let i = prog[pc];
        pc += 1;
        let k = i.k as usize;
        match i.code {
            LD_H_ABS => match frame.get(k..k + 2) {
                Some(b) => a = u16::from_be_bytes([b[0], b[1]]) as u32,
                None => return 0,
            },
            LD_B_ABS => match frame.get(k) {
                Some(b) => a = *b as u32,
                None => return 0,
            },
            JEQ_K => pc += if a == i.k { i.jt } else { i.jf } as usize,
            RET_K => return i.k,
            c => panic!("opcode {c:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{encode, Header, OVERHEAD};
    use proptest::prelude::*;

    fn frame(kind: Kind, channel: u16, session: u64, token: u64) -> Vec<u8> {
        let mut b = vec![0u8; OVERHEAD + 16];
        let h = Header {
            dst: [2; 6],
            src: [4; 6],
            kind,
            flags: 0,
            session,
            token,
            channel,
            slot: 0,
            seq: 0,
            ack: 0,
            credits: 0,
            len: 16,
            sack: 0,
        };
        let n = encode(&h, &mut b);
        b.truncate(n);
        b
    }

    #[test]
    fn channel_filter_keeps_its_channel_only() {
        let p = channel_program(7);
        assert_ne!(run(&p, &frame(Kind::Data, 7, 1, 2)), 0);
        assert_ne!(run(&p, &frame(Kind::Ack, 7, 1, 2)), 0);
        // Another session or token on the same number passes, so the
        // endpoint counts it as forged.
        assert_ne!(run(&p, &frame(Kind::Data, 7, 9, 9)), 0);
        assert_eq!(run(&p, &frame(Kind::Data, 8, 1, 2)), 0);
        assert_eq!(run(&p, &frame(Kind::Data, 0x0700, 1, 2)), 0);
        assert_eq!(run(&p, &[0u8; 20]), 0, "short frame");
    }

    #[test]
    fn listener_filter_keeps_opens_only() {
        let p = open_program();
        assert_ne!(run(&p, &frame(Kind::Open, 3, 1, 2)), 0);
        for k in [Kind::Data, Kind::Ack, Kind::Nack, Kind::Reset, Kind::OpenOk] {
            assert_eq!(run(&p, &frame(k, 3, 1, 2)), 0, "{k:?}");
        }
    }

    proptest! {
        /// On arbitrary bytes the channel filter keeps exactly the frames
        /// whose channel field (big endian, offset 38) is ours.
        #[test]
        fn channel_filter_matches_the_field(
            bytes in proptest::collection::vec(any::<u8>(), 0..80),
            ch in any::<u16>(),
        ) {
            let kept = run(&channel_program(ch), &bytes) != 0;
            let field = bytes.get(38..40).map(|b| u16::from_be_bytes([b[0], b[1]]));
            prop_assert_eq!(kept, field == Some(ch));
        }
    }
}
