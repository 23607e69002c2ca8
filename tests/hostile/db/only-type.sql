create type mood as enum ('ok', 'sad');
