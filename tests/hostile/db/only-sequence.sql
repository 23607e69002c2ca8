create sequence q;
