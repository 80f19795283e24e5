//! Fuzzes the record codec: decoding arbitrary bytes as any stored record never panics, and
//! whatever decodes re-encodes to a record that decodes to the same value.
#![no_main]

use courier::store::codec::{AttemptRecord, EndpointRecord, MessageRecord, Payload, Routing};
use libfuzzer_sys::fuzz_target;

macro_rules! roundtrip {
    ($ty:ty, $data:expr) => {
        if let Ok(rec) = <$ty>::decode($data) {
            let again = <$ty>::decode(&rec.encode()).expect("a re-encoded record decodes");
            assert!(again == rec, "{} changed in a round trip", stringify!($ty));
        }
    };
}

fuzz_target!(|data: &[u8]| {
    roundtrip!(MessageRecord, data);
    roundtrip!(Payload, data);
    roundtrip!(AttemptRecord, data);
    roundtrip!(EndpointRecord, data);
    roundtrip!(Routing, data);
});
