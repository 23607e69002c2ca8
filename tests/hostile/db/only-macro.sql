create macro m(a) as a + 1;
