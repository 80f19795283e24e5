//! A semaphore whose size a reload may change while permits are out: raising it adds
//! permits at once; lowering it forgets the free ones and owes the rest, which are taken
//! back (forgotten) as the attempts holding them finish and the next permit is asked for.
//! So after a cap is lowered, no new attempt starts until fewer than the new cap run.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A semaphore of `cap` permits that can be resized.
#[derive(Debug)]
pub struct Resizable {
    sem: Arc<Semaphore>,
    cap: u32,
    /// Permits still out that are to be forgotten when they come back.
    debt: u32,
}

impl Resizable {
    /// `cap` permits.
    pub fn new(cap: u32) -> Self {
        Resizable {
            sem: Arc::new(Semaphore::new(cap as usize)),
            cap,
            debt: 0,
        }
    }

    /// The size.
    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// Permits out now (at most the old size just after a lowering).
    pub fn in_use(&self) -> u32 {
        (self.cap + self.debt).saturating_sub(self.sem.available_permits() as u32)
    }

    /// One permit, unless `cap` are out.
    pub fn try_acquire(&mut self) -> Option<OwnedSemaphorePermit> {
        while self.debt > 0 {
            match self.sem.try_acquire() {
                Ok(p) => {
                    p.forget();
                    self.debt -= 1;
                }
                Err(_) => return None,
            }
        }
        self.sem.clone().try_acquire_owned().ok()
    }

    /// Changes the size to `cap`.
    pub fn resize(&mut self, cap: u32) {
        if cap >= self.cap {
            let more = cap - self.cap;
            let repaid = more.min(self.debt);
            self.debt -= repaid;
            self.sem.add_permits((more - repaid) as usize);
        } else {
            let fewer = self.cap - cap;
            let forgotten = self.sem.forget_permits(fewer as usize) as u32;
            self.debt += fewer - forgotten;
        }
        self.cap = cap;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowering_below_the_permits_out_admits_nothing_until_enough_come_back() {
        let mut r = Resizable::new(4);
        let held: Vec<_> = (0..4).map(|_| r.try_acquire().unwrap()).collect();
        r.resize(2);
        assert_eq!((r.cap(), r.in_use()), (2, 4));
        let mut held = held.into_iter();
        drop(held.next());
        assert!(r.try_acquire().is_none(), "3 out, cap 2");
        drop(held.next());
        assert!(r.try_acquire().is_none(), "2 out, cap 2");
        drop(held.next());
        let p = r.try_acquire().expect("1 out, cap 2");
        assert!(r.try_acquire().is_none());
        assert_eq!(r.in_use(), 2);
        drop(p);
        drop(held);
        assert_eq!(r.in_use(), 0);
        let all: Vec<_> = std::iter::from_fn(|| r.try_acquire()).collect();
        assert_eq!(all.len(), 2, "the new size exactly");
    }

    #[test]
    fn raising_repays_debt_first_then_adds_permits() {
        let mut r = Resizable::new(3);
        let held: Vec<_> = (0..3).map(|_| r.try_acquire().unwrap()).collect();
        r.resize(1);
        r.resize(5);
        assert_eq!((r.cap(), r.in_use()), (5, 3));
        let more: Vec<_> = std::iter::from_fn(|| r.try_acquire()).collect();
        assert_eq!(more.len(), 2);
        drop(held);
        drop(more);
        let all: Vec<_> = std::iter::from_fn(|| r.try_acquire()).collect();
        assert_eq!(all.len(), 5);
    }

    #[test]
    fn resizing_when_idle_is_exact() {
        for (from, to) in [(1, 10), (10, 1), (5, 5), (7, 0), (0, 3)] {
            let mut r = Resizable::new(from);
            r.resize(to);
            let all: Vec<_> = std::iter::from_fn(|| r.try_acquire()).collect();
            assert_eq!(all.len() as u32, to, "{from} -> {to}");
        }
    }
}
