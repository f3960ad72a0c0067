use super::*;

fn credits(buffers: u64, windows: &[u64], slots: usize) -> Credits {
    let returns = (0..slots)
        .map(|_| CreditReturn::new(Box::new(crate::transport::ClosedLink), 1, None))
        .collect();
    let mut w = windows.to_vec();
    w.resize(slots, 0);
    Credits {
        returns: Arc::new(returns),
        keys: StreamKeys {
            key: None,
            cipher: Cipher::None,
        },
        windows: w,
        buffers,
        window: windows[0],
        accepted: vec![0; slots],
    }
}

#[test]
fn an_added_stream_takes_free_buffers_then_the_widest_windows() {
    // 64 buffers over 4 streams of 8: 32 free, the new one gets 8.
    let mut c = credits(64, &[8, 8, 8, 8], 8);
    assert_eq!(c.make_room(4, 4), 8);
    assert_eq!(&c.windows[..5], &[8, 8, 8, 8, 8]);
    // 16 buffers held by 4 streams of 4: the 5th gets 16/5 = 3,
    // taken one credit each from three of them.
    let mut c = credits(16, &[4, 4, 4, 4], 8);
    assert_eq!(c.make_room(4, 4), 3);
    assert_eq!(c.windows[..5].iter().sum::<u64>(), 16);
    assert!(c.windows[..4].iter().all(|&w| w >= 3));
    // Writers give that many fewer credits back: the cursor moved on.
    let withheld: u64 = c.returns[..4]
        .iter()
        .map(|r| r.cursor.load(Ordering::Relaxed))
        .sum();
    assert_eq!(withheld, 3);
}

#[test]
fn no_room_past_the_slots_the_buffers_or_out_of_order() {
    // Every window at the minimum of 2: nothing to take.
    let mut c = credits(8, &[2, 2, 2, 2], 8);
    assert_eq!(c.make_room(4, 4), 0);
    assert_eq!(&c.windows[..4], &[2, 2, 2, 2]);
    // No slot left (the receiver pool's size).
    let mut c = credits(64, &[8, 8], 2);
    assert_eq!(c.make_room(2, 2), 0);
    // Not the next stream number.
    let mut c = credits(64, &[8, 8], 4);
    assert_eq!(c.make_room(3, 2), 0);
}
