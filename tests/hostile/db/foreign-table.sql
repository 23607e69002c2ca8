create table users(name varchar);
