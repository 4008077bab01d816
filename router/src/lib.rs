//! The router (DESIGN §3): turns "I need `order.query`" into a call to a healthy
//! instance. Not built yet; see the router issue.
