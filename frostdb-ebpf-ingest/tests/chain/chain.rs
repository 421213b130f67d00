//! A Rust call chain for the unwinder's tests, built by rustc at opt-level 2 without forced
//! frame pointers: main -> rust_a -> rust_b -> rust_c -> rust_leaf, which sleeps, or with
//! the argument `spin` spins.
//! `black_box` after each call keeps the frames (no tail calls).
use std::hint::black_box;
use std::io::Write;

#[inline(never)]
fn rust_leaf(n: u64) {
    println!("ready");
    std::io::stdout().flush().unwrap();
    let spin = std::env::args().nth(1).as_deref() == Some("spin");
    let mut x = n;
    loop {
        if spin {
            for i in 0..1_000_000u64 {
                x = black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        } else {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
        black_box(x);
    }
}

#[inline(never)]
fn rust_c(n: u64) {
    rust_leaf(black_box(n + 1));
    black_box(n);
}

#[inline(never)]
fn rust_b(n: u64) {
    rust_c(black_box(n + 1));
    black_box(n);
}

#[inline(never)]
fn rust_a(n: u64) {
    rust_b(black_box(n + 1));
    black_box(n);
}

fn main() {
    rust_a(black_box(1));
}
