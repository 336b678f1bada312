//! The host's side of decisions, run in decision order but outside the policy's lock.

use std::collections::VecDeque;
use std::sync::{Mutex, TryLockError};

pub(crate) type Answer = Box<dyn FnOnce() + Send>;

/// The host's side of decisions (executing their actions), run in decision order but outside
/// the worker's lock. An answer is queued while the lock is held, which fixes its place; after
/// releasing the lock, whoever decided runs the queue, unless another thread already is (which
/// then runs this answer too).
#[derive(Default)]
pub(crate) struct Delivery {
    queue: Mutex<VecDeque<Answer>>,
    running: Mutex<()>,
}

impl Delivery {
    /// Queues an answer. Call under the worker's lock.
    pub(crate) fn push(&self, answer: Answer) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(answer);
    }

    /// Runs the queued answers in order, unless another thread is running them. Call after
    /// releasing the worker's lock.
    pub(crate) fn run(&self) {
        // Nothing queued (a decision answered by a reply): whoever queues next runs it.
        if self.is_empty() {
            return;
        }
        loop {
            let _running = match self.running.try_lock() {
                Ok(guard) => guard,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            loop {
                let next = self
                    .queue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pop_front();
                match next {
                    Some(answer) => answer(),
                    None => break,
                }
            }
            drop(_running);
            // An answer queued after the last look, by a thread that found this one running.
            if self.is_empty() {
                return;
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn delivery_runs_every_answer_once_in_the_order_queued_whichever_thread_runs_it() {
        let delivery = Arc::new(Delivery::default());
        // Stands in for the worker's lock, which fixes the order answers are queued in.
        let deciding = Arc::new(Mutex::new(0usize));
        let ran = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (delivery, deciding, ran) = (delivery.clone(), deciding.clone(), ran.clone());
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        {
                            let mut next = deciding.lock().unwrap();
                            let turn = *next;
                            *next += 1;
                            let ran = ran.clone();
                            delivery.push(Box::new(move || ran.lock().unwrap().push(turn)));
                        }
                        delivery.run();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(*ran.lock().unwrap(), (0..2000).collect::<Vec<_>>());
    }

    #[test]
    fn an_answer_that_queues_another_has_it_run_after_itself_without_deadlock() {
        let delivery = Arc::new(Delivery::default());
        let ran = Arc::new(Mutex::new(Vec::new()));
        let (inner_delivery, inner_ran, outer_ran) = (delivery.clone(), ran.clone(), ran.clone());
        delivery.push(Box::new(move || {
            outer_ran.lock().unwrap().push("first");
            // As executing actions that feed the policy again does: decided, queued, run.
            inner_delivery.push(Box::new(move || inner_ran.lock().unwrap().push("second")));
            inner_delivery.run();
            outer_ran.lock().unwrap().push("first done");
        }));
        delivery.run();
        assert_eq!(*ran.lock().unwrap(), ["first", "first done", "second"]);
    }
}
