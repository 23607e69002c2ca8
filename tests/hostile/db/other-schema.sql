create schema s; create table s.t(x int);
