//! isthmus operator: the NetworkLink API, the pure plan computation and the controller around it.
